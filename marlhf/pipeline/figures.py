"""The figures recorded with a shipped long-horizon or arithmetic base (``pretraining.json``): answers
of the model to held-out prompts of its tasks, and their gold score, length and verdict accuracy (or
answer accuracy and step lines right), greedy and sampled; and those of the multi-turn trail task's
base (games played on its environments).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from marlhf.data import trail
from marlhf.data.long_tasks import N_TRAIN, TASKS, answer_verdict, correct_verdict, generate
from marlhf.data.long_tasks import gold as gold_of
from marlhf.data.reasoning_tasks import N_TRAIN as ARITH_N_TRAIN
from marlhf.data.reasoning_tasks import TASKS as ARITH_TASKS
from marlhf.data.reasoning_tasks import arith_gold, final_answer, first_line, line_accuracy
from marlhf.data.reasoning_tasks import generate as arith_generate
from marlhf.data.synthetic import prompt_of
from marlhf.envs.config import EnvConfig
from marlhf.envs.loading import load_env
from marlhf.envs.runner import run_episodes
from marlhf.models.zoo import ARITH_NEW_TOKENS, HORIZON_NEW_TOKENS, TRAIL_NEW_TOKENS


def generate_answers(
    model, tok, prompts: list[str], max_new_tokens: int, temperature: float, batch: int = 16
) -> tuple[list[str], list[int], int]:
    """Answers of a causal LM (left-padded batches; temperature 0: greedy, else pure sampling with
    the torch RNG as it stands), their token lengths without EOS, and how many ended with EOS."""
    kwargs = {"do_sample": False}
    if temperature > 0:
        kwargs = {"do_sample": True, "temperature": temperature, "top_k": 0}
    answers, lengths, ended = [], [], 0
    for i in range(0, len(prompts), batch):
        enc = tok(prompts[i : i + batch], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(
                **enc, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id, **kwargs
            )
        for row in out[:, enc["input_ids"].shape[1] :].tolist():
            n = row.index(tok.eos_token_id) if tok.eos_token_id in row else len(row)
            ended += n < len(row)
            lengths.append(n)
            answers.append(tok.decode(row[:n], skip_special_tokens=True))
    return answers, lengths, ended


def horizon_figures(model_dir: str | Path, horizon: int, prompts: int = 32) -> dict:
    """Gold score (mean), verdict accuracy, EOS rate and answer tokens (mean, min, max) of a model on
    the first ``prompts`` held-out (``valid1``) prompts of both tasks at ``horizon``, greedy and
    sampled at temperature 1 (seed 0, at most ``HORIZON_NEW_TOKENS[horizon]`` new tokens)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    figures: dict = {"prompts_per_task": prompts}
    for family in ("facts", "verdict"):
        task = TASKS[f"synthetic-{family}-{horizon}"]
        texts = [prompt_of(r) for r in generate(task, prompts, 0, "valid1", id_offset=N_TRAIN)]
        for mode, temperature in (("greedy", 0.0), ("T1", 1.0)):
            torch.manual_seed(0)
            answers, lengths, ended = generate_answers(
                model, tok, texts, HORIZON_NEW_TOKENS[horizon], temperature
            )
            pairs = list(zip(texts, answers, strict=True))
            entry = {
                "gold": round(sum(gold_of(task)(p, a) for p, a in pairs) / len(pairs), 3),
                "eos_rate": round(ended / len(pairs), 3),
                "tokens_mean": round(sum(lengths) / len(lengths), 1),
                "tokens_min": min(lengths),
                "tokens_max": max(lengths),
            }
            if family == "verdict":
                right = sum(answer_verdict(a) == correct_verdict(p) for p, a in pairs)
                entry["verdict_accuracy"] = round(right / len(pairs), 3)
            figures[f"{task.name}/{mode}"] = entry
    return figures


def arith_figures(model_dir: str | Path, prompts: int = 64, tasks: Sequence[str] = ()) -> dict:
    """Per arithmetic task (4, 8, 16 steps; ``tasks``: these task names only), greedy and sampled at
    temperature 1 (seed 0, at most ``ARITH_NEW_TOKENS`` new tokens) on the first ``prompts``
    held-out (``valid``) problems:
    ``accuracy`` (mean gold: the share of right final answers), ``answer_line`` (share with a
    readable answer line), ``line_accuracy`` (share of step lines right from their own previous
    total, ``reasoning_tasks.line_accuracy``), the first line's ``start_read``, ``first_operation``
    and ``first_line`` shares (``reasoning_tasks.first_line``), EOS rate and answer tokens (mean,
    min, max)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    figures: dict = {"prompts_per_task": prompts}
    unknown = [t for t in tasks if t not in ARITH_TASKS]
    if unknown:
        raise ValueError(
            f"arith_figures: unknown task(s) {unknown}; the tasks: {list(ARITH_TASKS)}"
        )
    for task in ARITH_TASKS.values():
        if tasks and task.name not in tasks:
            continue
        texts = [r["prompt"] for r in arith_generate(task, prompts, 0, "valid", ARITH_N_TRAIN)]
        for mode, temperature in (("greedy", 0.0), ("T1", 1.0)):
            torch.manual_seed(0)
            answers, lengths, ended = generate_answers(
                model, tok, texts, ARITH_NEW_TOKENS, temperature
            )
            pairs = list(zip(texts, answers, strict=True))
            checked = [line_accuracy(p, a) for p, a in pairs]
            right, total = sum(r for r, _ in checked), sum(n for _, n in checked)
            firsts = [first_line(p, a) for p, a in pairs]

            def share(key: str, firsts=firsts) -> float:
                return round(sum(f[key] for f in firsts) / len(firsts), 3)

            figures[f"{task.name}/{mode}"] = {
                "accuracy": round(sum(arith_gold(p, a) for p, a in pairs) / len(pairs), 3),
                "answer_line": round(
                    sum(final_answer(a) is not None for a in answers) / len(pairs), 3
                ),
                "line_accuracy": round(right / max(total, 1), 3),
                "start_read": share("start_read"),
                "first_operation": share("operation_right"),
                "first_line": share("right"),
                "eos_rate": round(ended / len(pairs), 3),
                "tokens_mean": round(sum(lengths) / len(lengths), 1),
                "tokens_min": min(lengths),
                "tokens_max": max(lengths),
            }
    return figures


def chat_act(model, tok, temperature: float, max_new_tokens: int, end_of_turn: int | None = None):
    """A policy for :func:`marlhf.envs.runner.run_episodes` from a causal LM with a chat template:
    each turn re-renders the conversations with the generation prompt (left-padded batch) and
    samples (temperature 0: greedy) up to ``max_new_tokens`` or the end-of-turn token (default
    eos); the action is the text before it."""
    eot = tok.eos_token_id if end_of_turn is None else end_of_turn
    kwargs = {"do_sample": False}
    if temperature > 0:
        kwargs = {"do_sample": True, "temperature": temperature, "top_k": 0}

    def act(rows: list[int], conversations: list[list[dict]]) -> list[str]:
        texts = [
            tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
            for c in conversations
        ]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=eot,
                **kwargs,
            )
        actions = []
        for row in out[:, enc["input_ids"].shape[1] :].tolist():
            n = row.index(eot) if eot in row else len(row)
            actions.append(tok.decode(row[:n], skip_special_tokens=True))
        return actions

    return act


def trail_scores(model, tok, turns: int, prompts: int, temperature: float, seed: int = 0) -> dict:
    """Gold (the share of games won), the share of first calls to the key person and the mean turns
    of a model on the first ``prompts`` held-out (``valid``) games of the trail task at ``turns``
    turns (temperature 0: greedy; torch seed ``seed``; environments in this process)."""
    rows = trail.rows(turns, prompts, seed=0, split="valid")
    worlds = [trail.World.from_info(r["extra_info"]) for r in rows]
    factory = load_env(f"marlhf-trail-{turns}")
    cfg = EnvConfig(env=factory.spec, max_turns=turns, env_timeout_s=0)
    torch.manual_seed(seed)
    episodes = run_episodes(factory, rows, chat_act(model, tok, temperature, TRAIL_NEW_TOKENS), cfg)
    pairs = list(zip(worlds, episodes, strict=True))
    return {
        "gold": round(sum(trail.gold(w, e.messages) for w, e in pairs) / len(pairs), 3),
        "first_call_key": round(
            sum(trail.first_call(e.messages) == w.key for w, e in pairs) / len(pairs), 3
        ),
        "turns_mean": round(sum(len(e.turns) for _, e in pairs) / len(pairs), 2),
    }


def trail_figures(model_dir: str | Path, prompts: int = 32) -> dict:
    """:func:`trail_scores` of a model on the first ``prompts`` held-out games at 2, 4 and 8 turns,
    greedy and sampled at temperature 1 (seed 0)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    figures: dict = {"prompts_per_task": prompts}
    for turns in trail.TURNS:
        for mode, temperature in (("greedy", 0.0), ("T1", 1.0)):
            figures[f"marlhf-trail-{turns}/{mode}"] = trail_scores(
                model, tok, turns, prompts, temperature
            )
    return figures
