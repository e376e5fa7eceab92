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
- ``auto_rank`` and :meth:`GenerationBackend.supports`: where ``--generation_backend auto`` looks
  (the supporting backend of lowest rank; None: never chosen by ``auto``);
- ``continues_conversations``: whether :meth:`GenerationBackend.open_conversations` continues a
  multi-turn conversation from what it holds of it (the static decoder's KV cache, vLLM's prefix
  cache), reading only each turn's new tokens; otherwise
  :func:`marlhf.models.generation.conversations.open_conversations` re-reads every conversation
  from its start at each turn through :meth:`GenerationBackend.sample`;
- ``implementation``: ``"package.module:Class"`` of the subclass that samples, imported when the
  backend is first opened (a built-in backend's declaration); None: this class samples.

This module imports no torch when it runs (the configuration and ``--help`` read the classes).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
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
    rows of one call; ``max_conversation_len``: the most tokens of one conversation that
    :meth:`GenerationBackend.open_conversations` continues (0: prompt + response only; an engine
    sizes its context for it); ``context_flags``: the flags whose sum is prompt + response (named in
    errors); ``zero3``: ``model``'s weights are ZeRO-3 partitioned, ``gathered``: the caller
    gathers them around every call."""

    model: torch.nn.Module | None = None
    model_path: str = ""
    dtype: str = "fp32"
    seed: int = 0
    max_rows: int = 1
    max_conversation_len: int = 0
    context_flags: str = "--max_prompt_seq_len + --max_answer_seq_len"
    trust_remote_code: bool = False
    zero3: bool = False
    gathered: bool = True


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


@dataclass
class SampledTurn:
    """One turn's actions, one entry per row of the :meth:`Conversations.sample_turn` call, in its
    order.

    action_ids[i]: the tokens row i sampled, up to and including its first EOS (at least one
    token); ends_with_eos[i]: false for an action cut at the length limit; logprobs[i],
    entropy[i]: one float per action token, recorded while sampling (as :class:`Sampled`'s),
    None where the backend records none."""

    action_ids: list[list[int]]
    ends_with_eos: list[bool]
    logprobs: list[list[float]] | None = None
    entropy: list[list[float]] | None = None


class Conversations(ABC):
    """Rows' multi-turn conversations, continued turn by turn (opened by
    :func:`marlhf.models.generation.conversations.open_conversations`).

    Row ``r`` reads exactly ``prompt_r + a_1 + c_1 + a_2 + c_2 + ...``: its prompt, then each
    turn's sampled action ``a_k`` (its tokens as sampled, never re-tokenised) followed by the
    context ``c_k`` the caller gives before the next turn (the observations and the next
    generation prompt: :meth:`marlhf.models.conversation.ChatLayout.context`). Turn ``k`` (0, 1,
    ...) of row ``r`` draws its tokens from :func:`~marlhf.models.generation.conversations.turn_seeds`
    of the row's seed and ``k``, so an episode depends on its seed, its tokens and the weights
    only, not on the other rows or on which of them still play (up to the float rounding of
    batched kernels), and the recorded log-probs are those of one forward pass over the finished
    conversation."""

    @abstractmethod
    def sample_turn(
        self,
        rows: Sequence[int],
        context_ids: Sequence[Sequence[int]],
        cfg: SamplingConfig,
        eos_ids: list[int],
        pad_id: int,
    ) -> SampledTurn:
        """Append ``context_ids[i]`` (possibly empty; the first turn's usually is) after the last
        action of row ``rows[i]`` and sample its next action: up to ``cfg.max_answer_seq_len``
        tokens at ``cfg``'s temperature, top-k and top-p, stopping after the first token of
        ``eos_ids``, and never past the conversation's length limit. A row left out of a call
        has ended: it cannot be named again (ValueError)."""

    @abstractmethod
    def conversation(self, row: int) -> list[int]:
        """Row ``row``'s tokens so far: its prompt, actions and contexts."""

    def close(self) -> None:  # noqa: B027 - no-op where nothing is held
        """Release what the conversations hold (a KV cache)."""


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
    auto_rank: ClassVar[int | None] = None
    continues_conversations: ClassVar[bool] = False
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

    def open_conversations(
        self, prompt_ids: Sequence[Sequence[int]], row_seeds: torch.Tensor, max_len: int
    ) -> Conversations:
        """With ``continues_conversations``: conversations of the prompts ``prompt_ids`` (one
        token list per row, unpadded), row ``r`` seeded by ``row_seeds[r]`` ((R,) long), each at
        most ``max_len`` tokens long (see :class:`Conversations`). Callers go through
        :func:`marlhf.models.generation.conversations.open_conversations`."""
        raise NotImplementedError(f"--generation_backend {self.name} re-reads conversations")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:  # noqa: B027
        """Load (checkpoint name, tensor) pairs into the backend's own copy of the weights
        (``needs_weight_sync``); wakes a sleeping backend."""

    def sleep(self) -> None:  # noqa: B027 - no-op unless can_sleep
        """Free the backend's memory until the next :meth:`load_weights` (``can_sleep``)."""

    def close(self) -> None:  # noqa: B027 - no-op without an engine
        """Release the backend's engine at the end of the run."""
