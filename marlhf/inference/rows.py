"""One batch of prompts -> result rows: sample (one response per prompt, or ``n`` programs per APPS
problem), score with the reward model and/or the problems' tests, or score the dataset's own
chosen/rejected responses (``--ref-scores``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from marlhf.data.chat import prompt_messages, render_prompt
from marlhf.inference.config import InferenceConfig
from marlhf.inference.generation import eos_ids, generate
from marlhf.inference.macro_view import macro_items
from marlhf.inference.models import Models
from marlhf.inference.prompts import batch_seed, left_pad, prompt_token_ids, row_seeds
from marlhf.inference.scoring import TextScorer, score_rollout
from marlhf.rewards.code import code_reward, extract_code, parse_tests


def ref_rows(
    batch: list[Any], scorer: TextScorer, gold: Callable[[str, str], float] | None = None
) -> list[dict]:
    """Rows of ``--ref-scores``: the chosen and rejected responses scored by the RM."""
    prompts = [e.prompt for e in batch]
    chosen_r, chosen_n = scorer(prompts, [e.chosen for e in batch])
    rejected_r, _ = scorer(prompts, [e.rejected for e in batch])
    rows = []
    for b, e in enumerate(batch):
        row = {
            "prompt_id": e.prompt_id,
            "prompt": e.prompt,
            "response": e.chosen,
            "reward": float(chosen_r[b]),
            "chosen_response": e.chosen,
            "chosen_reward": float(chosen_r[b]),
            "rejected_response": e.rejected,
            "rejected_reward": float(rejected_r[b]),
            "response_tokens": chosen_n[b],
            "ends_with_eos": True,
        }
        if gold is not None:
            row["gold"] = row["chosen_gold"] = gold(e.prompt, e.chosen)
            row["rejected_gold"] = gold(e.prompt, e.rejected)
        rows.append(row)
    return rows


@dataclass
class Sampled:
    """One sampled batch of ``N = B * n`` rows (each prompt's ``n`` samples are consecutive rows).

    prompt_ids, prompt_mask: (N, P) left-padded; response: (N, A) long, right-padded after the first
    EOS; action_mask: (N, A) bool; ends: (N,) bool, the response ends with EOS; lengths, texts,
    prompts, rm_scores: one per row (rm_scores None without a reward model); cut: prompts cut from the
    left to ``--max-prompt-len``.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response: torch.Tensor
    action_mask: torch.Tensor
    ends: torch.Tensor
    lengths: list[int]
    texts: list[str]
    prompts: list[str]
    rm_scores: list[float | None]
    cut: int


def sample_batch(
    batch: list[Any],
    cfg: InferenceConfig,
    models: Models,
    scorer: TextScorer | None,
    shared_ids: bool,
    n: int,
) -> Sampled:
    """Generate ``n`` responses per prompt and score them with the RM (if any): on the policy's
    token ids when the vocabularies agree (as PPO scores a rollout), else on re-tokenised text."""
    tok = models.tokenizer
    prompt_texts = [e.prompt for e in batch]
    if cfg.apply_chat_template:  # the model sees the template's text; rows keep the task's prompt
        prompt_texts = [render_prompt(tok, prompt_messages(e)) for e in batch]
    ids, cut = prompt_token_ids(tok, prompt_texts, cfg.sampling.max_prompt_seq_len)
    prompt_ids, prompt_mask = left_pad(ids, tok.pad_token_id)
    if n > 1:  # (B*n, P): each prompt's samples are consecutive rows
        prompt_ids = prompt_ids.repeat_interleave(n, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(n, dim=0)
    # a backend that seeds rows draws each sample from its own seed; the others from the global
    # RNG, seeded per batch
    seeds = row_seeds(cfg.seed, [e.prompt_id for e in batch], n)
    torch.manual_seed(batch_seed(cfg.seed, batch[0].prompt_id))
    eos = eos_ids(tok, models.policy, cfg)
    response, action_mask, ends = generate(
        models.sampler, prompt_ids, prompt_mask, cfg, eos, tok.pad_token_id, seeds
    )
    lengths = action_mask.sum(1).tolist()
    texts = tok.batch_decode(response, skip_special_tokens=True)
    prompts = [e.prompt for e in batch for _ in range(n)]

    rm_scores: list[float | None] = [None] * len(texts)
    if models.reward_model is not None:
        if shared_ids:
            rm_scores = score_rollout(
                models.reward_model,
                prompt_ids,
                prompt_mask,
                response,
                action_mask,
                tok.pad_token_id,
            ).tolist()
        else:
            rm_scores = scorer(prompts, texts, ends.tolist())[0].tolist()
    return Sampled(
        prompt_ids,
        prompt_mask,
        response,
        action_mask,
        ends,
        lengths,
        texts,
        prompts,
        rm_scores,
        cut,
    )


def _rm_rows(
    batch: list[Any],
    s: Sampled,
    cfg: InferenceConfig,
    gold: Callable[[str, str], float] | None,
    with_rm: bool,
) -> list[dict]:
    """One row per prompt, rewarded by the RM (``with_rm``; else the row has no ``reward``)."""
    rows: list[dict] = []
    for b, e in enumerate(batch):
        row = {"prompt_id": e.prompt_id, "prompt": e.prompt, "response": s.texts[b]}
        if with_rm:
            row["reward"] = s.rm_scores[b]
        row["response_tokens"] = int(s.lengths[b])
        row["ends_with_eos"] = bool(s.ends[b])
        if gold is not None:
            row["gold"] = gold(e.prompt, s.texts[b])
        if cfg.save_token_ids:
            row["response_ids"] = s.response[b, : s.lengths[b]].tolist()
        rows.append(row)
    return rows


def _code_rows(
    batch: list[Any], s: Sampled, cfg: InferenceConfig, rewarder: Any, n: int, with_rm: bool
) -> tuple[list[dict], list[float]]:
    """One row per APPS problem over its ``n`` programs, rewarded by the pass fraction of its tests;
    also the reward of every program."""
    texts, lengths = s.texts, s.lengths
    suites = [parse_tests(e.meta["tests"]) for e in batch for _ in range(n)]
    results = rewarder.score([extract_code(t) for t in texts], suites)
    rewards = [code_reward(r, "pass_fraction") for r in results]
    rows: list[dict] = []
    for p, e in enumerate(batch):
        sl = slice(p * n, (p + 1) * n)
        row = {
            "prompt_id": e.prompt_id,
            "prompt": e.prompt,
            "response": texts[p * n],
            "reward": sum(rewards[sl]) / n,
            "responses": texts[sl],
            "rewards": rewards[sl],
            "n_correct": sum(r.total > 0 and r.passed == r.total for r in results[sl]),
            "response_tokens": sum(lengths[sl]) / n,
            "ends_with_eos": float(s.ends[sl].float().mean()),
        }
        if with_rm:
            row["rm_rewards"] = s.rm_scores[sl]
        if cfg.save_token_ids:
            row["response_ids"] = [
                s.response[j, : lengths[j]].tolist() for j in range(p * n, (p + 1) * n)
            ]
        rows.append(row)
    return rows, rewards


def generate_rows(
    batch: list[Any],
    cfg: InferenceConfig,
    models: Models,
    scorer: TextScorer | None,
    shared_ids: bool,
    rewarder: Any,
    gold: Callable[[str, str], float] | None,
    rule: Any,
    want_items: bool,
) -> tuple[list[dict], list[dict], int]:
    """Rows of one batch, the macro-action view items (if ``want_items``) and the prompts cut."""
    n = cfg.n_samples_per_prompt if rewarder is not None else 1
    s = sample_batch(batch, cfg, models, scorer, shared_ids, n)
    if rewarder is None:
        rows = _rm_rows(batch, s, cfg, gold, models.reward_model is not None)
        item_rewards: list = s.rm_scores
    else:
        rows, item_rewards = _code_rows(batch, s, cfg, rewarder, n, models.reward_model is not None)
    items: list[dict] = []
    if want_items and rule is not None:
        items = macro_items(
            rule,
            models,
            s.prompt_ids,
            s.prompt_mask,
            s.response,
            s.action_mask,
            s.ends,
            s.prompts,
            item_rewards,
            cfg.sampling.temperature,
            cfg.seed,
        )
    return rows, items, s.cut
