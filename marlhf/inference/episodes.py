"""``marlhf infer --env``: each prompt row an episode on the environment, written as a result row
with its turns.

The prompt rows are those of PPO's ``--env`` runs (:mod:`marlhf.data.env_rows`): ``--dataset``
names a ``.jsonl``/``.json``/``.parquet`` file of rows in SkyRL's format or
``marlhf-trail-{2,4,8}[:N]`` (the bundled task's held-out ``valid`` games with ``--split eval``,
its ``train`` games with ``--split train``); ``--num-samples`` of them are selected by their ids as
single-turn prompts are. Each batch is played by :func:`marlhf.envs.runner.run_episodes` with the
``--env`` flags, the policy's turns sampled by :class:`marlhf.envs.turns.TurnSampler` through the
run's generation backend (as PPO's rollouts sample them: the conversation kept in tokens, rendered
with the policy's chat template; the static decoder continues each conversation from its KV cache),
each row's turns seeded from ``--seed`` and its prompt id.

A row (:func:`episode_row`) carries ``turns``: the conversation after the first prompt, in order,
each ``{"role": "policy", "text", "reward", "tokens", "ends_with_eos"}`` (``reward``: what
``step`` returned for it, null for none; + ``token_ids`` with ``--save_token_ids``) or
``{"role": "observation", "text", "message_role"}`` (a message of the environment's answer);
``prompt_messages``: the first prompt as the environment's ``init`` returned it; ``reward``: the
episode's total reward (the sum of its turns', none counted 0); ``num_turns`` (policy turns),
``stop`` (``done``, ``max_turns``, ``length`` or ``error``), ``done``, ``stopped_max_turns``,
``env_error`` (the error line, ``--env_errors zero_reward``), ``env_metrics`` (its
``get_metrics()``); ``response``: the last policy turn's text; ``response_tokens``: the policy's
tokens over all turns; ``ends_with_eos``: the last turn's. With ``--reward-model``, ``rm_reward``
is its score of the whole conversation at its last action token, as PPO's ``--reward_source rm``
scores it; on the trail task ``gold`` is 1 when the last turn names the holder.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from marlhf.data.env_rows import episode_row as env_prompt_row
from marlhf.data.env_rows import load_env_rows, trail_gold
from marlhf.envs.config import EnvConfig
from marlhf.envs.loading import EnvFactory, load_env
from marlhf.envs.runner import Episode, run_episodes
from marlhf.envs.turns import TurnSampler, check_first_prompt, env_layout
from marlhf.inference.config import InferenceConfig
from marlhf.inference.generation import eos_ids
from marlhf.inference.models import Models
from marlhf.inference.prompts import batch_seed, left_pad, row_seeds, select_prompts
from marlhf.inference.scoring import TextScorer, score_rollout
from marlhf.models.conversation import ChatLayout, ConversationTokens

log = logging.getLogger("marlhf.inference")  # one logger name for the whole program


@dataclass(frozen=True)
class EnvPrompt:
    """One prompt row of an episode: its id (what selection and resuming read) and the row."""

    prompt_id: str
    row: dict


def select_env_prompts(cfg: InferenceConfig) -> list[EnvPrompt]:
    """The ``--num-samples`` prompt rows of ``--dataset`` (module doc), selected by id."""
    split = "valid" if cfg.split == "eval" else "train"
    rows = load_env_rows((cfg.dataset,), 0, cfg.skip_bad_rows, split=split, flag="--dataset")
    prompts = [EnvPrompt(r["prompt_id"], r) for r in rows]
    return select_prompts(prompts, cfg.num_samples, cfg.selection_seed)


@dataclass(frozen=True)
class EnvPlay:
    """What plays the episodes of a run: the environment's factory, the policy tokenizer's chat
    layout, the ``--env`` flags and the gold of the trail task (``--gold_score``)."""

    factory: EnvFactory
    layout: ChatLayout
    cfg: EnvConfig
    gold: bool


def env_play(cfg: InferenceConfig, env: EnvConfig, tokenizer: Any) -> EnvPlay:
    """The environment of ``--env`` (ValueError naming it when it cannot be found) and the chat
    layout of the policy's tokenizer (ValueError when it has no chat template)."""
    factory = load_env(env.env, env.env_config)
    layout = env_layout(env.env, tokenizer, f"the policy (--model_name_or_path {cfg.model})")
    return EnvPlay(factory, layout, env, cfg.gold_score != "off")


def check_gold(cfg: InferenceConfig, prompts: Sequence[EnvPrompt]) -> None:
    """ValueError for ``--gold_score on`` with rows of another task than the trail task."""
    if cfg.gold_score == "on" and any(not _is_trail(p.row) for p in prompts):
        raise ValueError(
            f"--gold_score on: --dataset {cfg.dataset} holds rows of no bundled task (the trail "
            "task, marlhf-trail-{2,4,8}, alone has a gold score among environments)"
        )


def _is_trail(row: dict) -> bool:
    return str(row.get("data_source", "")).startswith("marlhf-trail")


def _plain(value: Any) -> Any:
    """A metric as JSON: numbers as floats (numpy's too), bools and strings kept, else its text."""
    if isinstance(value, bool | str) or value is None:
        return value
    if isinstance(value, numbers.Real):
        return float(value)
    return str(value)


def episode_row(
    prompt: EnvPrompt,
    ep: Episode,
    actions: Sequence[tuple[str, list[int]]],
    eos: Sequence[int],
    save_token_ids: bool,
    play: EnvPlay,
) -> dict:
    """The result row of one episode (module doc); ``actions``: each turn's (text, sampled ids)."""
    turns: list[dict] = []
    for turn, (_, ids) in zip(ep.turns, actions, strict=True):
        policy = {
            "role": "policy",
            "text": turn.action,
            "reward": turn.reward,
            "tokens": len(ids),
            "ends_with_eos": bool(ids) and ids[-1] in eos,
        }
        if save_token_ids:
            policy["token_ids"] = list(ids)
        turns.append(policy)
        for m in turn.observations:
            turns.append({"role": "observation", "text": m["content"], "message_role": m["role"]})
    policy_turns = [t for t in turns if t["role"] == "policy"]
    row: dict[str, Any] = {
        "prompt_id": prompt.prompt_id,
        "prompt": "\n".join(m["content"] for m in ep.prompt),
        "prompt_messages": [dict(m) for m in ep.prompt],
        "response": policy_turns[-1]["text"] if policy_turns else "",
        "reward": float(sum(ep.rewards)),
        "turns": turns,
        "num_turns": len(ep.turns),
        "stop": ep.stop,
        "done": ep.done,
        "stopped_max_turns": ep.stop == "max_turns",
        "response_tokens": sum(t["tokens"] for t in policy_turns),
        "ends_with_eos": bool(policy_turns) and policy_turns[-1]["ends_with_eos"],
    }
    if ep.error is not None:
        row["env_error"] = ep.error
    if ep.metrics:
        row["env_metrics"] = {str(k): _plain(v) for k, v in ep.metrics.items()}
    if play.gold:
        gold = trail_gold(prompt.row, ep.messages)
        if gold is not None:
            row["gold"] = gold
    return row


def conversation_scores(
    convs: Sequence[ConversationTokens],
    models: Models,
    scorer: TextScorer,
    shared_ids: bool,
) -> list[float]:
    """The reward model's score of each whole conversation (up to its last action) at its last
    token: on the policy's token ids when the vocabularies agree (as PPO scores a multi-turn
    rollout), else on the conversation's text re-tokenised (its prompt as the chat template
    rendered it, then the rest)."""
    tok = models.tokenizer
    heads = [c.token_ids[: c.prompt_len] for c in convs]
    rests = [c.token_ids[c.prompt_len :] for c in convs]
    if not shared_ids:
        prompts = [tok.decode(h) for h in heads]
        texts = [tok.decode(r) for r in rests]
        ends = [bool(r) and r[-1] == tok.eos_token_id for r in rests]
        return scorer(prompts, texts, ends)[0].tolist()
    prompt_ids, prompt_mask = left_pad(heads, tok.pad_token_id)
    A = max(max(len(r) for r in rests), 1)
    response = torch.full((len(convs), A), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(convs), A, dtype=torch.bool)
    for b, r in enumerate(rests):
        response[b, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[b, : len(r)] = True
    return score_rollout(
        models.reward_model, prompt_ids, prompt_mask, response, mask, tok.pad_token_id
    ).tolist()


@torch.no_grad()
def play_rows(
    batch: list[EnvPrompt],
    cfg: InferenceConfig,
    play: EnvPlay,
    models: Models,
    scorer: TextScorer | None,
    shared_ids: bool,
) -> list[dict]:
    """The result rows of one batch of prompt rows, each played as an episode (module doc).
    Raises :class:`marlhf.envs.runner.EnvError` for an environment's error under ``--env_errors
    fail`` (one line naming the environment, the prompt row and the turn)."""
    tok = models.tokenizer
    rows = [p.row for p in batch]
    check_first_prompt(play.layout, rows, play.cfg.max_total_seq_len)
    eos = eos_ids(tok, models.policy, cfg)
    torch.manual_seed(batch_seed(cfg.seed, batch[0].prompt_id))  # backends without row seeds
    seeds = row_seeds(cfg.seed, [p.prompt_id for p in batch])
    turns = TurnSampler(
        play.layout, models.sampler, cfg.sampling, eos, tok.pad_token_id, seeds,
        play.cfg.max_total_seq_len, models.device,
    )  # fmt: skip
    names = [f"prompt row {p.prompt_id}" for p in batch]
    try:
        episodes = run_episodes(
            play.factory, [env_prompt_row(r) for r in rows], turns, play.cfg, turns.measure, names
        )
    finally:
        models.sampler.end_conversations()
    out = [
        episode_row(p, ep, turns.actions[i], turns.eos_ids, cfg.save_token_ids, play)
        for i, (p, ep) in enumerate(zip(batch, episodes, strict=True))
    ]
    if models.reward_model is not None and scorer is not None:
        scores = conversation_scores(turns.finished(episodes), models, scorer, shared_ids)
        for row, s in zip(out, scores, strict=True):
            row["rm_reward"] = float(s) if row["num_turns"] else None
    return out
