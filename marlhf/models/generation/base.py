"""What a generation backend is: :class:`GenerationBackend`, the sampler every program calls
(PPO's rollouts, its held-out evaluation and its Monte-Carlo continuations, ``marlhf infer``),
what it is opened on (:class:`SamplerSetup`) and what one call returns (:class:`Sampled`).

A backend is a registered subclass (:mod:`marlhf.models.generation.registry`: a built-in one is
declared there and implemented in :mod:`marlhf.models.generation.backends`, one of one's own is a
``--plugin`` file). Its class states what the callers must know about it:

- ``records_logprobs`` / ``records_entropy``: whether a call returns log π(a_t | s_t) of each
  sampled token (and the entropy of π(· | s_t)) at the sampling temperature, before top-k/top-p,
  so that PPO can take π_old from the record instead of a second forward pass;
- ``seeds_rows``: whether it takes one seed per row (``row_seeds``) and draws row ``b``'s tokens
  from ``row_seeds[b]``, its prompt and the weights alone, so that a row samples the same response
  in any batch, on any number of ranks; otherwise it draws from the global RNG (the caller seeds it);
- ``uses_model``: whether it samples with the caller's model in this process (the caller puts the
  model in eval mode and gathers ZeRO-3 weights around each call), or holds its own copy of the
  weights (``needs_weight_sync``: :meth:`GenerationBackend.load_weights` after every update);
- ``can_sleep``: whether :meth:`GenerationBackend.sleep` frees its memory until the next
  :meth:`GenerationBackend.load_weights` (a no-op elsewhere);
- ``samples_partitioned``: whether it can sample from a ZeRO-3 partitioned model without the
  whole weights being gathered first;
- ``continues_conversations``: whether it continues multi-turn conversations from a state of its
  own (:meth:`GenerationBackend.sample_turn`, reading only each conversation's new tokens);
  otherwise :func:`marlhf.models.generation.sampling.sample_turns` gives it each whole
  conversation as a prompt (:meth:`GenerationBackend.sample`), which re-reads it every turn;
- ``collective`` (an instance's, not the class's): whether each call is a collective over the
  data-parallel ranks (the forward passes of a ZeRO-3 partitioned model all-gather its weights),
  so that every rank must make as many calls as the others;
- ``auto_rank`` and :meth:`GenerationBackend.supports`: where ``--generation_backend auto`` looks
  (the supporting backend of lowest rank; None: never chosen by ``auto``);
- ``implementation``: ``"package.module:Class"`` of the subclass that samples, imported when the
  backend is first opened (a built-in backend's declaration); None: this class samples.

This module imports no torch when it runs (the configuration and ``--help`` read the classes).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    import torch


class SamplingConfig(Protocol):
    """What a backend reads of the sampling flags
    (:class:`marlhf.models.generation.config.SamplingConfig`)."""

    max_prompt_seq_len: int
    max_answer_seq_len: int
    temperature: float
    top_k: int
    top_p: float
    compile_generation: bool
    vllm: Any  # marlhf.models.vllm_engine.VLLMConfig


@dataclass(frozen=True)
class SamplerSetup:
    """What a backend is opened on, once per program run.

    ``model``: the policy as a module in this process (None where only an engine of its own is
    needed); ``model_path``: its directory (an engine loads it from there); ``dtype``: ``fp32``,
    ``bf16`` or ``fp16``; ``seed``: the seed of draws without row seeds; ``max_rows``: the most
    rows of one call; ``context_flags``: the flags whose sum is prompt + response (named in
    errors); ``zero3``: ``model``'s weights are ZeRO-3 partitioned, ``gathered``: the caller
    gathers them around every call."""

    model: torch.nn.Module | None = None
    model_path: str = ""
    dtype: str = "fp32"
    seed: int = 0
    max_rows: int = 1
    context_flags: str = "--max_prompt_seq_len + --max_answer_seq_len"
    trust_remote_code: bool = False
    zero3: bool = False
    gathered: bool = True


@dataclass(frozen=True)
class Conversations:
    """The conversations of one turn of a batch of multi-turn episodes, B of them (the rows still
    playing), as :meth:`GenerationBackend.sample_turn` receives them.

    ``token_ids[b]``: row ``rows[b]``'s whole conversation so far as token ids, ending with the
    generation prompt of its next turn (the first prompt, at its first turn). ``rows[b]``: the
    row's key, stable over the turns of one batch of episodes (until
    :meth:`GenerationBackend.end_conversations`); a row that has ended is not called again.
    ``seen[b]``: how many of ``token_ids[b]``'s first tokens the backend has read or sampled for
    that row in its earlier calls (0 at the row's first turn: a new conversation): the previous
    call's conversation and the tokens sampled then. The tokens after them are new: the
    end-of-turn token when the previous action was cut at the length limit, what the chat template
    puts after an action, the environment's observations and the next generation prompt
    (:class:`marlhf.models.conversation.ChatLayout`). The sampled tokens are never re-tokenised:
    ``token_ids[b][seen[b] - k : seen[b]]`` are the ``k`` tokens the backend sampled last time."""

    token_ids: list[list[int]]
    rows: list[int]
    seen: list[int]

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.rows) != n or len(self.seen) != n:
            raise ValueError(
                f"Conversations: {n} token lists, {len(self.rows)} rows, {len(self.seen)} seen"
            )
        for ids, seen in zip(self.token_ids, self.seen, strict=True):
            if not ids or not 0 <= seen < len(ids):
                raise ValueError(
                    f"Conversations: {seen} tokens seen of a conversation of {len(ids)}: "
                    "every turn brings new tokens"
                )


@dataclass
class Sampled:
    """One call's responses to B left-padded prompts.

    response_ids: (B, A) long, right-padded with ``pad_id`` after each row's first EOS (the EOS
    kept), A >= 1; action_mask: (B, A) bool, the valid tokens (a prefix of each row, its EOS
    included); ends_with_eos: (B,) bool, false for a response cut at the length limit; logprobs,
    entropy: (B, A) float32 recorded while sampling (0 on padding), None where the backend records
    none."""

    response_ids: torch.Tensor
    action_mask: torch.Tensor
    ends_with_eos: torch.Tensor
    logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None


class GenerationBackend(ABC):
    """A sampler: opened once on a :class:`SamplerSetup` (:meth:`open`), called once per batch
    (:meth:`sample`). The class attributes are described in the module doc; a backend that holds
    no weights of its own keeps the no-op :meth:`load_weights`, :meth:`sleep` and :meth:`close`."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one sentence of --generation_backend's help
    records_logprobs: ClassVar[bool] = False
    records_entropy: ClassVar[bool] = False
    seeds_rows: ClassVar[bool] = False
    uses_model: ClassVar[bool] = True
    needs_weight_sync: ClassVar[bool] = False
    can_sleep: ClassVar[bool] = False
    samples_partitioned: ClassVar[bool] = False
    continues_conversations: ClassVar[bool] = False
    collective: bool = False  # set per instance (module doc)
    auto_rank: ClassVar[int | None] = None
    implementation: ClassVar[str | None] = None

    @classmethod
    def supports(cls, model_config: Any) -> bool:
        """Whether ``auto`` may pick this backend for a model of ``model_config`` (its HF config);
        read from the declaration, so no torch."""
        return True

    @classmethod  # noqa: B027 - a hook: nothing to refuse unless a backend says so
    def check(cls, cfg: SamplingConfig) -> None:
        """Raise ``ValueError`` (one line naming the flag) for settings this backend cannot
        honour; called before anything is loaded."""

    @classmethod
    @abstractmethod
    def open(cls, cfg: SamplingConfig, setup: SamplerSetup) -> GenerationBackend:
        """The sampler of one run."""

    @abstractmethod
    def sample(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        cfg: SamplingConfig,
        eos_ids: list[int],
        pad_id: int,
        row_seeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Up to ``cfg.max_answer_seq_len`` new tokens per row of the left-padded prompts
        ``prompt_ids``, ``prompt_mask`` (B, P), at ``cfg``'s temperature, top-k and top-p; each
        row stops after its first token of ``eos_ids``. ``row_seeds``: (B,) long, with
        ``seeds_rows`` (None: the global RNG). Returns (response_ids (B, A') long, A' <=
        ``cfg.max_answer_seq_len``; logprobs and entropy (B, A') float32 or None), on the
        prompts' device."""

    def sample_turn(
        self,
        conversations: Conversations,
        cfg: SamplingConfig,
        eos_ids: list[int],
        pad_id: int,
        row_seeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``continues_conversations`` backends: the next action of each of B conversations
        (:class:`Conversations`), continued from the backend's state of each row, which has read
        ``conversations.seen[b]`` tokens: only ``token_ids[b][seen[b]:]`` are read here (a
        backend that holds no state for a row, or one that does not match, reads the whole
        conversation). Up to ``cfg.max_answer_seq_len`` new tokens per row at ``cfg``'s
        temperature, top-k and top-p, each row stopping after its first token of ``eos_ids``;
        ``row_seeds`` (B,) long as for :meth:`sample`. Returns what :meth:`sample` returns
        (response_ids (B, A') long, right-padded with ``pad_id`` after each row's first EOS;
        logprobs and entropy (B, A') float32 or None), on the CPU or any device, and the same
        tokens and log-probs (up to float rounding) as :meth:`sample` with the whole
        conversations as left-padded prompts and the same ``row_seeds``: what
        ``tests/models/test_continuation.py`` checks of the static decoder."""
        raise NotImplementedError(f"generation backend {self.name!r} continues no conversation")

    def end_conversations(self) -> None:  # noqa: B027 - no state unless continues_conversations
        """The batch of episodes is over: forget every row's state (:meth:`sample_turn`)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:  # noqa: B027
        """Load (checkpoint name, tensor) pairs into the backend's own copy of the weights
        (``needs_weight_sync``); wakes a sleeping backend."""

    def sleep(self) -> None:  # noqa: B027 - no-op unless can_sleep
        """Free the backend's memory until the next :meth:`load_weights` (``can_sleep``)."""

    def close(self) -> None:  # noqa: B027 - no-op without an engine
        """Release the backend's engine at the end of the run."""
