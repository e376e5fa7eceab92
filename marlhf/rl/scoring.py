"""2. Score a rollout: the forward passes (log π_old, log π_ref, entropies, critic values, the reward
model) and the sequence-level reward of each response (reward model, code execution or the gold
oracle, and Segment-PPO's dense segment rewards).

A scored rollout is a dict of tensors (``old_logprobs``, ``entropy``, ``ref_logprobs``,
``ref_entropy``, ``values`` (B, A); with a reward model ``rm_values`` (B, T) and ``scores`` (B,)).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import torch

from marlhf.logprobs import DEFAULT_CHUNK_ELEMENTS, entropy_from_logits, token_logprobs
from marlhf.rl.length_groups import Grouping, grouped
from marlhf.rl.models import eval_mode
from marlhf.rl.rewards import normalize_scores, spread_segment_rewards
from marlhf.rl.rollout import (
    Rollout,
    end_index,
    gather_response,
    pad_right,
    response_logprobs_and_entropy,
    sequence_lengths,
    slice_rollout,
)

if TYPE_CHECKING:
    from marlhf.rl.config import PPOConfig, PPOStageConfig
    from marlhf.rl.models import Models


def response_positions(ro: Rollout) -> torch.Tensor:
    """(B, A) long: the position whose logit predicts response token j of each row,
    ``response_start[b] − 1 + j`` clamped into the row (padding entries are masked by callers)."""
    A, T = ro.response_ids.shape[1], ro.sequences.shape[1]
    j = torch.arange(A, device=ro.sequences.device)
    return (ro.response_start.to(j.device).unsqueeze(1) - 1 + j).clamp(0, T - 2)


# the no-grad score pass materialises at most this many logits at once (rows are scored in chunks):
# 2^28 = 512 MiB in bf16. With grad (the update's minibatches) every row's logits are kept anyway.
SCORE_CHUNK_ELEMENTS = 2**28


def _vocab_size(module) -> int | None:
    config = getattr(module, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "vocab_size", None)


def policy_forward(
    engine,
    ro: Rollout,
    temperature: float,
    *,
    with_entropy: bool = False,
    all_positions: bool = False,
    chunk_elements: int = SCORE_CHUNK_ELEMENTS,
    groups: Grouping | None = None,
):
    """(logprobs (B, A), entropy (B, A) | None) of the response tokens under ``engine``'s policy.

    By default the LM head runs at the response positions only
    (:func:`marlhf.rl.response_logits.logits_at`), the attention is plain causal, without the
    padding mask (the rows are flush-left: padding only follows a row's tokens, which no real token
    attends to), the temperature is applied block by block inside the chunked log-softmax
    (`marlhf.logprobs`), the rows go through the model in passes of rows of similar length
    (``groups``, :mod:`marlhf.rl.length_groups`), and without grad in chunks of at most
    ``chunk_elements`` logits (B·A·V). ``all_positions`` is the reference path (the head at
    every position, the padding mask passed, one pass): equal up to float rounding."""
    if all_positions:
        logits = engine(
            input_ids=ro.sequences, attention_mask=ro.attention_mask.long(), use_cache=False
        ).logits
        logits = logits / temperature
        A = ro.response_ids.shape[1]
        return response_logprobs_and_entropy(
            logits, ro.sequences, ro.response_start, A, with_entropy=with_entropy
        )
    if groups is not None and groups.max_groups > 1:
        return _by_length(
            lambda r: policy_forward(
                engine, r, temperature, with_entropy=with_entropy, chunk_elements=chunk_elements
            ),
            ro,
            (ro.response_ids.shape[1],) * 2,
            groups,
        )
    B, A = ro.response_ids.shape
    V = _vocab_size(engine.module)
    rows = B if torch.is_grad_enabled() or not V else max(1, chunk_elements // (A * V))
    if rows >= B:
        return _response_forward(engine, ro, temperature, with_entropy)
    block = min(chunk_elements, DEFAULT_CHUNK_ELEMENTS)  # the log-softmax's float32 scratch
    parts = [
        _response_forward(engine, _rows(ro, b, min(B, b + rows)), temperature, with_entropy, block)
        for b in range(0, B, rows)
    ]
    logp = torch.cat([p[0] for p in parts])
    return logp, torch.cat([p[1] for p in parts]) if with_entropy else None


def _rows(ro: Rollout, b0: int, b1: int) -> Rollout:
    """Rows b0..b1 of ``ro`` at the full widths (T, A)."""
    return Rollout(
        ro.sequences[b0:b1], ro.attention_mask[b0:b1], ro.response_start[b0:b1],
        ro.response_ids[b0:b1], ro.action_mask[b0:b1], ro.ends_with_eos[b0:b1],
        ro.prompt_ids[b0:b1],
    )  # fmt: skip


def _response_forward(
    engine, ro: Rollout, temperature: float, with_entropy: bool, block=DEFAULT_CHUNK_ELEMENTS
):
    """One forward pass of :func:`policy_forward`'s default path over all of ``ro``'s rows;
    ``block``: the chunked log-softmax's block (logits upcast at once)."""
    from marlhf.rl.response_logits import logits_at

    pos = response_positions(ro)
    with logits_at(engine.module, pos):
        logits = engine(input_ids=ro.sequences, use_cache=False).logits
    if logits.shape[1] != pos.shape[1]:  # no LM head to hook: the full (B, T, V) came back
        V = logits.shape[-1]
        logits = torch.gather(logits, 1, pos.unsqueeze(-1).expand(*pos.shape, V))
    labels = torch.gather(ro.sequences, 1, pos + 1)
    # the temperature is applied block by block inside (no tempered copy of the logits)
    logp = token_logprobs(logits, labels, temperature=temperature, chunk_elements=block)
    ent = (
        entropy_from_logits(logits, temperature=temperature, chunk_elements=block)
        if with_entropy
        else None
    )
    return logp, ent


def _by_length(forward, ro: Rollout, widths, groups: Grouping | None):
    """``forward(rollout)`` over ``ro`` in passes of rows of similar length (``groups``), or in one
    pass (None or one group): :func:`marlhf.rl.length_groups.grouped` over ``ro``'s rows, each
    group cut to its own longest row (``slice_rollout``)."""
    if groups is None or groups.max_groups == 1:
        return forward(ro)
    return grouped(
        lambda rows: forward(slice_rollout(ro, rows)), sequence_lengths(ro), widths, groups
    )


def critic_forward(
    engine, ro: Rollout, *, all_positions: bool = False, groups: Grouping | None = None
) -> torch.Tensor:
    """V(s_j) for every response token j: the value at the position just before it. (B, A)
    Plain causal attention in passes of rows of similar length (``groups``), unless
    ``all_positions`` (see :func:`policy_forward`)."""

    def forward(r: Rollout) -> torch.Tensor:
        values = engine(input_ids=r.sequences, attention_mask=_mask(r, all_positions))
        return gather_response(values, r.response_start, r.response_ids.shape[1])

    return _by_length(forward, ro, ro.response_ids.shape[1], None if all_positions else groups)


def reward_forward(
    engine, ro: Rollout, *, all_positions: bool = False, groups: Grouping | None = None
) -> torch.Tensor:
    """The reward model's value at every position, (B, T); passes as in :func:`critic_forward`.
    Past a row's tokens the values are meaningless (what padding scores, or 0 when grouped)."""

    def forward(r: Rollout) -> torch.Tensor:
        return engine(input_ids=r.sequences, attention_mask=_mask(r, all_positions))

    return _by_length(forward, ro, ro.sequences.shape[1], None if all_positions else groups)


def _mask(ro: Rollout, padding_mask: bool) -> torch.Tensor | None:
    """The attention mask to pass: none (causal attention; flush-left rows) unless asked."""
    return ro.attention_mask.long() if padding_mask else None


@torch.inference_mode()
def score(
    models: Models,
    ro: Rollout,
    cfg: PPOStageConfig,
    need_entropy: bool,
    later_values: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The forward passes of one generation batch (see the module docstring for the keys), all
    with dropout off (:func:`marlhf.rl.models.eval_mode`). ``need_entropy``: also the reference's
    entropies (the termination rules that read them). Under ``torch.inference_mode`` (no
    autograd bookkeeping; the outputs are only read later). log π_old and its entropy come from the
    rollout when the decoder recorded both (the static decoder: same weights, same dtype), unless
    ``--recompute_old_logprobs``; vLLM's record (log-probs, no entropy) leaves them to the actor. ``later_values``: (k,) long rows whose critic values are left
    at 0 here (the update's first minibatch: :func:`kept_critic_values` computes them)."""
    T = cfg.generation.temperature
    full = cfg.perf.score_all_positions
    groups = None if full else cfg.perf.grouping
    critic = models.critic  # None: a critic-free estimator (values are 0)
    with eval_mode(*(e for e in (models.actor, critic) if e is not None)):
        recorded = ro.logprobs is not None and ro.entropy is not None  # the static decoder's
        if recorded and not cfg.perf.recompute_old_logprobs:
            old_logp, entropy = ro.logprobs, ro.entropy
        else:
            old_logp, entropy = policy_forward(
                models.actor, ro, T, with_entropy=True, all_positions=full, groups=groups
            )
        ref_logp, ref_ent = policy_forward(
            models.ref, ro, T, with_entropy=need_entropy, all_positions=full, groups=groups
        )
        if critic is None:
            values = torch.zeros_like(old_logp)
        elif later_values is None:
            values = critic_forward(critic, ro, all_positions=full, groups=groups)
        else:
            values = torch.zeros_like(old_logp)
            rest = _other_rows(ro.sequences.shape[0], later_values)
            if len(rest):
                part = critic_forward(critic, slice_rollout(ro, rest), groups=groups)
                values[rest, : part.shape[1]] = part
    out = {
        "old_logprobs": old_logp,
        "entropy": entropy,
        "ref_logprobs": ref_logp,
        "ref_entropy": ref_ent,
        "values": values,
    }
    if models.reward is not None:
        rm_values = reward_forward(models.reward, ro, all_positions=full, groups=groups)
        out["rm_values"] = rm_values
        out["scores"] = torch.gather(
            rm_values, 1, end_index(ro.attention_mask).unsqueeze(1)
        ).squeeze(1)
    return out


def _other_rows(B: int, rows: torch.Tensor) -> torch.Tensor:
    """The rows 0 … B−1 not in ``rows``, in order: (B − k,) long."""
    keep = torch.ones(B, dtype=torch.bool)
    keep[rows.cpu()] = False
    return keep.nonzero()[:, 0]


def reuses_critic_forward(models: Models, cfg: PPOStageConfig) -> bool:
    """Whether the update's first minibatch takes its critic pass from scoring
    (``--reuse_critic_forward``): on one rank (elsewhere the first minibatch holds other ranks'
    rows), on the default path, with no dropout in the critic (scoring runs it without dropout,
    the update with it)."""
    from marlhf.distributed import world_size

    if not cfg.perf.reuse_critic_forward or models.critic is None or world_size() != 1:
        return False
    if cfg.perf.score_all_positions:
        return False
    for m in models.critic.module.modules():
        if isinstance(m, torch.nn.Dropout) and m.p > 0:
            return False
        p = getattr(m, "attention_dropout", None)
        if isinstance(p, float) and p > 0:
            return False
    return True


def kept_critic_values(models: Models, ro: Rollout, scored: dict, rows: torch.Tensor, cfg):
    """The critic's pass over ``rows`` of ``ro`` with grad, as the update's first minibatch runs it
    (train mode: no dropout, see :func:`reuses_critic_forward`); writes its values into
    ``scored["values"]`` (left at 0 there by :func:`score`) and returns
    :class:`marlhf.rl.update.KeptValues` for the update."""
    from marlhf.rl.update import KeptValues

    values = critic_forward(models.critic, slice_rollout(ro, rows), groups=cfg.perf.grouping)
    filled = scored["values"].clone()  # a normal tensor (scoring made an inference-mode one)
    filled[rows, : values.shape[1]] = values.detach()
    scored["values"] = filled
    return KeptValues(rows, values)


def concat_scored(scoreds: list[dict], seq_width: int, num_actions: int) -> dict:
    """Concatenate the scored dicts of generation batches, right-padding per-token tensors with 0
    to ``seq_width`` (``rm_values``) or ``num_actions`` (the rest)."""
    if len(scoreds) == 1:
        return scoreds[0]
    scored: dict[str, torch.Tensor | None] = {}
    for k in scoreds[0]:
        vals = [s[k] for s in scoreds]
        if vals[0] is None:
            scored[k] = None
        elif vals[0].dim() == 1:
            scored[k] = torch.cat(vals)
        else:
            width = seq_width if k == "rm_values" else num_actions
            scored[k] = torch.cat([pad_right(v, width, 0.0) for v in vals])
    return scored


# --------------------------------------------------------------------------------------------------
# sequence-level rewards


def gold_scorer(cfg: PPOStageConfig):
    """The synthetic task's true quality, logged when the prompts come from it (else None):
    ``synthetic-tldr`` or a long-horizon task (`marlhf.data.long_tasks.gold_scorer_for`)."""
    from marlhf.data.long_tasks import gold_scorer_for

    return gold_scorer_for(cfg.data.data_path)


def _test_suite(meta: dict):
    """The test cases of a prompt's problem (APPS ``input_output``); an empty suite if none."""
    from marlhf.code_reward import TestSuite, parse_tests

    raw = meta.get("tests") or meta.get("input_output")
    return parse_tests(raw) if raw else TestSuite((), ())


def has_tests(meta_json: str) -> bool:
    """Whether a prompt's ``meta`` (JSON) holds usable test cases for the code reward."""
    try:
        return len(_test_suite(json.loads(meta_json or "{}"))) > 0
    except ValueError:  # malformed tests: the problem cannot be scored
        return False


def _code_rewards(
    ro: Rollout, metas: list[dict], tokenizer, rewarder
) -> tuple[torch.Tensor, dict[str, float]]:
    """Execution reward (B,) of each response against its task's test cases (sandboxed), and the
    batch's ``code/*`` metrics (:func:`marlhf.code_reward.code_stats`)."""
    from marlhf.code_reward import code_stats

    texts = tokenizer.batch_decode(
        ro.response_ids.masked_fill(~ro.action_mask, tokenizer.pad_token_id),
        skip_special_tokens=True,
    )
    rewards, results = rewarder.evaluate(texts, [_test_suite(m) for m in metas])
    return torch.tensor(rewards, dtype=torch.float32), code_stats(results, rewards)


def sequence_scores(
    ro: Rollout,
    scored: dict[str, torch.Tensor],
    metas: list[dict],
    tokenizer,
    ppo: PPOConfig,
    rewarder=None,
    score_stats=None,
    oracle=None,
    prompt_texts: list[str] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The sequence-level reward of each response, (B,): the reward model's end score
    (normalised with ``--normalize_reward``) plus, with a ``rewarder`` (``--reward_source code`` or
    ``rm+code``), the execution reward of the program against ``metas[b]``'s tests, plus, with an
    ``oracle`` (``--reward_source gold``: ``oracle(prompt, response_text) -> float``), the oracle's
    score of each response to ``prompt_texts[b]``. Returns the scores and the ``code/*`` metrics
    ({} without a rewarder). The (clipped) score goes on each row's last valid token
    (:func:`marlhf.rl.experience.token_rewards`)."""
    scores = torch.zeros(ro.sequences.shape[0], device=ro.sequences.device)
    if oracle is not None:
        if prompt_texts is None or len(prompt_texts) != len(scores):
            raise ValueError("an oracle reward needs one prompt text per response")
        texts = tokenizer.batch_decode(
            ro.response_ids.masked_fill(~ro.action_mask, tokenizer.pad_token_id),
            skip_special_tokens=True,
        )
        scores = scores + torch.tensor(
            [float(oracle(p, r)) for p, r in zip(prompt_texts, texts, strict=True)],
            device=scores.device,
        )
    stats: dict[str, float] = {}
    raw_rm = scored.get("scores")
    if raw_rm is not None:
        rm = raw_rm
        if ppo.normalize_reward and score_stats is not None:
            rm = normalize_scores(rm, score_stats.mean, score_stats.std)
        scores = scores + rm
    if rewarder is not None:
        code, stats = _code_rewards(ro, metas, tokenizer, rewarder)
        scores = scores + code.to(scores.device)
    return scores, stats


# --------------------------------------------------------------------------------------------------
# Segment-PPO's dense rewards (--dense_reward)


def segment_rule(models: Models, tokenizer):
    """The termination rule the segment reward model was trained with (its reward_config.json)
    and its location-aware normaliser (or None)."""
    from marlhf.macro import MacroConfig, build_termination

    info = models.reward_info or {}
    if info.get("rm_type") != "segment":
        raise ValueError(
            "--dense_reward needs a segment reward model (stage 2 with --rm_type segment)"
        )
    seg_cfg = MacroConfig(
        **{k: (tuple(v) if isinstance(v, list) else v) for k, v in info["termination"].items()}
    )
    return build_termination(seg_cfg, tokenizer), info.get("normalizer")


def dense_rewards(
    seg_rule,
    normalizer,
    ro: Rollout,
    scored: dict,
    cfg: PPOStageConfig,
    seeds: torch.Tensor | None = None,
) -> torch.Tensor:
    """Segment-PPO dense rewards (B, A): the segment RM's value at each of its segments' last
    tokens, location-normalised (``normalizer``), spread over the segment's tokens. ``seg_rule`` and
    ``normalizer``: from :func:`segment_rule`."""
    from marlhf.distributed import all_gather_padded
    from marlhf.macro import TerminationInputs, build_segments
    from marlhf.reward_norm import segment_positions, segment_readout

    if "rm_values" not in scored:
        raise ValueError("--dense_reward needs the segment reward model's per-token values")
    term = seg_rule(
        TerminationInputs(
            ro.response_ids,
            ro.action_mask,
            ro.ends_with_eos,
            scored["ref_logprobs"],
            scored.get("ref_entropy"),
            row_seeds=seeds,
            all_gather=all_gather_padded,
        )
    )
    seg_rewards, seg_mask = segment_readout(scored["rm_values"], ro.response_start, term.macro_end)
    if normalizer is not None:
        seg_rewards = normalizer.apply(seg_rewards, segment_positions(seg_mask)) * seg_mask
    seg_ids = build_segments(term.macro_end, ro.action_mask).ids
    return spread_segment_rewards(seg_rewards, seg_ids, cfg.ppo.dense_reward_mode)
