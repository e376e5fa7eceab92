"""The cost of multi-turn sampling: a k-turn conversation continued turn by turn, the same
conversation re-read from its start every turn, and one single-turn response with as many action
tokens, on the static decoder (and vLLM where it is installed).

    .venv/bin/python benchmarks/bench_multiturn.py                   # static decoder, CPU
    .venv-vllm/bin/python benchmarks/bench_multiturn.py --backends static vllm

The policy is ``--model`` (default the trail task's base ``tiny-base-trail``, float32) on
``--batch`` prompts of the trail task (``marlhf.data.trail``, 30 tokens with the template). A
conversation of k turns (``--turns``, default 2, 4, 8 as ``marlhf-trail-{2,4,8}``) samples
``--action_tokens`` tokens per turn (no stop token, so every row samples exactly as many) and gets
after each action one fixed context, the one the trail environment's answer makes
(``<eos>``, ``my boss: call my cousin.`` and the generation prompt, 9 tokens): the environment
costs nothing here. For each backend and k, three ways, measured interleaved (their order rotated
every repeat), ``--repeats`` times after a warm-up:

- ``continue``: the conversations sampled turn by turn as multi-turn PPO samples them
  (:func:`marlhf.models.generation.sampling.sample_turns`), each turn reading the new tokens only
  (static: one KV cache, ``StaticBackend.sample_turn``; vLLM: sent whole, its prefix cache);
- ``reread``: the same conversations read from their start every turn (static: through
  ``sample``; vLLM: the prefix cache emptied before each turn);
- ``single``: one response of k × ``--action_tokens`` tokens to the same prompts;
- ``single_all_tokens``: the same, its prompt followed by the k - 1 contexts: as many tokens as
  the conversation, in one turn (what is left of ``continue``'s cost is that of the turns).

With ``--env_step_ms T`` (> 0) the conversations are also played through the episode runner
(:func:`marlhf.envs.runner.run_episodes`, as multi-turn PPO plays them) on an environment whose
every step takes T ms (``benchmarks/fixed_turns.py``'s ``FixedTurns``: a tool call or a remote
service; each row's step in a thread of its own, ``--env_workers`` = the batch), with the same
actions and contexts:

- ``env``: sample every row's turn, then step every row (``--env_overlap 1``);
- ``env_overlap``: the rows in ``--overlap`` groups that take turns, the environments stepping one
  group while the policy samples the next (``--env_overlap``).

It prints the median seconds of each, the medians of the per-repeat ratios ``continue / single``
(the goal: at most 1.10), ``reread / single`` and ``continue / single_all_tokens`` (and with an
environment ``env / single``, ``env_overlap / single`` and ``env_overlap / env``), the prompt
tokens each way reads, and for vLLM the share of prompt tokens its prefix cache served. The last
line is JSON. Run from the repository root with it on the path (``PYTHONPATH=.``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from importlib.util import find_spec

import torch


def _env_ways(sampler, prompts, context, turns: int, m: int, cfg, step_ms: float, groups: int):
    """``env`` and ``env_overlap`` (module doc): the conversations of ``continue`` played by the
    episode runner on ``FixedTurns``; each returns its prompt tokens read."""
    import json as _json

    from marlhf.envs.config import EnvConfig
    from marlhf.envs.loading import load_env
    from marlhf.envs.runner import run_episodes

    B = len(prompts)
    seeds = torch.arange(B) + 1000
    factory = load_env(
        "benchmarks.fixed_turns:FixedTurns", _json.dumps({"step_s": step_ms / 1000, "turns": turns})
    )
    rows = [{"prompt": [{"role": "user", "content": "q"}]} for _ in range(B)]
    vllm = getattr(sampler, "engine", None)

    def play(overlap: int):
        if vllm is not None:
            vllm.llm.reset_prefix_cache()
        convs, seen, played, read = [list(p) for p in prompts], [0] * B, [0] * B, [0]

        def act(ids, _messages):  # the same tokens as continue's, a subset of rows at a call
            read[0] += _continue_rows(sampler, cfg, m, context, seeds, convs, seen, played, ids)
            return [""] * len(ids)

        env = EnvConfig(env=factory.spec, env_timeout_s=0, env_workers=B, max_turns=turns,
                        env_overlap=overlap)  # fmt: skip
        episodes = run_episodes(factory, rows, act, env)
        assert all(len(e.turns) == turns and e.done for e in episodes)
        sampler.end_conversations()
        return read[0]

    return {"env": lambda: play(1), "env_overlap": lambda: play(groups)}


def _continue_rows(sampler, cfg, m: int, context, seeds, convs, seen, played, rows) -> int:
    """One turn of ``rows`` by continuation, as the episode runner plays it: a row that played
    before gets the fixed context after its last action, then the sampler continues each row's
    conversation from the tokens it has seen (``seen``) with the row's seed of that turn. Returns
    the prompt tokens read: a new row's whole prompt, else its last action's token and the
    context."""
    from marlhf.models.generation import Conversations
    from marlhf.models.generation.sampling import sample_turns
    from marlhf.runtime.rows import turn_seeds

    for r in rows:
        if played[r]:
            convs[r].extend(context)
    batch = Conversations([list(convs[r]) for r in rows], list(rows), [seen[r] for r in rows])
    seeds_k = torch.cat([turn_seeds(seeds[r : r + 1], played[r] + 1) for r in rows])
    out = sample_turns(sampler, batch, cfg, [], 0, seeds_k)
    assert out.action_mask.sum(1).tolist() == [m] * len(rows)
    read = 0
    for b, r in enumerate(rows):
        read += len(convs[r]) if not played[r] else len(context) + 1
        convs[r].extend(out.response_ids[b, :m].tolist())
        seen[r], played[r] = len(convs[r]), played[r] + 1
    return read


def _layout(path: str):
    from transformers import AutoTokenizer

    from marlhf.data import trail
    from marlhf.models.conversation import ChatLayout

    tok = AutoTokenizer.from_pretrained(path)
    return ChatLayout(tok, chat_template=tok.chat_template or trail.CHAT_TEMPLATE)


def _prompts(layout, batch: int) -> tuple[list[list[int]], list[int]]:
    """The trail task's first prompts and the fixed context after an action cut at its length."""
    from benchmarks.fixed_turns import OBSERVATION
    from marlhf.data import trail

    rows = trail.rows(8, batch, seed=0, split="valid")
    prompts = [layout.prompt(r["prompt"]) for r in rows]
    context = layout.context(rows[0]["prompt"], "call my boss", OBSERVATION, ended=False)
    return prompts, context


def _sampler(name: str, path: str, cfg, batch: int):
    from marlhf.models.generation import SamplerSetup, open_sampler

    model = None
    if name == "static":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    setup = SamplerSetup(model=model, model_path=path, max_rows=batch)
    return open_sampler(name, cfg, setup)


def _ways(sampler, prompts, context, turns: int, m: int, cfg):
    """The three ways of one backend and turn count, as functions (each returns its prompt
    tokens read)."""
    from marlhf.models.generation.sampling import left_pad, sample_responses
    from marlhf.runtime.rows import turn_seeds

    B = len(prompts)
    rows = list(range(B))
    seeds = torch.arange(B) + 1000
    single_cfg = _with(cfg, max_answer_seq_len=m * turns)
    ids = torch.tensor(prompts)  # the trail prompts all have the template's 30 tokens
    vllm = getattr(sampler, "engine", None)

    def play(replay: bool):
        if vllm is not None:
            vllm.llm.reset_prefix_cache()
        convs, seen, played, read = [list(p) for p in prompts], [0] * B, [0] * B, 0
        for k in range(turns):
            if not replay:
                read += _continue_rows(sampler, cfg, m, context, seeds, convs, seen, played, rows)
                continue
            if vllm is not None:
                vllm.llm.reset_prefix_cache()
            if k > 0:
                for c in convs:
                    c.extend(context)
            ids_k, mask_k = left_pad(convs, 0)
            out = sample_responses(sampler, ids_k, mask_k, cfg, [], 0, turn_seeds(seeds, k + 1))
            read += sum(len(c) for c in convs)
            assert out.action_mask.sum(1).tolist() == [m] * B
            for b, c in enumerate(convs):
                c.extend(out.response_ids[b, :m].tolist())
        sampler.end_conversations()
        return read

    # the conversation's other tokens (the contexts) before the single response instead
    long_ids = torch.cat([ids, torch.tensor([context * (turns - 1)] * B, dtype=torch.long)], 1)

    def single(prompt_ids):
        def fn():
            if vllm is not None:
                vllm.llm.reset_prefix_cache()
            mask = torch.ones_like(prompt_ids)
            out = sample_responses(sampler, prompt_ids, mask, single_cfg, [], 0, seeds)
            assert out.action_mask.sum(1).tolist() == [m * turns] * B
            return prompt_ids.numel()

        return fn

    return {
        "continue": lambda: play(False),
        "reread": lambda: play(True),
        "single": single(ids),
        "single_all_tokens": single(long_ids),
    }


def _with(cfg, **changes):
    import copy

    out = copy.copy(cfg)
    for k, v in changes.items():
        setattr(out, k, v)
    return out


def measure(ways: dict, repeats: int, engine=None) -> dict:
    """Median seconds of each way, interleaved (order rotated every repeat), after a warm-up;
    the per-repeat ratios to ``single``; prompt tokens read; vLLM's prefix-cache share."""
    names = list(ways)
    read = {n: ways[n]() for n in names}  # warm-up
    times: dict[str, list[float]] = {n: [] for n in names}
    cached: dict[str, list[float]] = {n: [] for n in names}
    for i in range(repeats):
        for n in names[i % len(names) :] + names[: i % len(names)]:
            if engine is not None:
                engine.prefix_tokens.update(prompt=0, cached=0)
            t = time.perf_counter()
            ways[n]()
            times[n].append(time.perf_counter() - t)
            if engine is not None:
                p = engine.prefix_tokens
                cached[n].append(p["cached"] / max(p["prompt"], 1))
    out = {f"{n}_s": round(statistics.median(times[n]), 4) for n in names}
    pairs = [("continue", "single"), ("reread", "single"), ("continue", "single_all_tokens")]
    if "env" in ways:
        pairs += [("env", "single"), ("env_overlap", "single"), ("env_overlap", "env")]
    for n, d in pairs:
        ratios = [a / b for a, b in zip(times[n], times[d], strict=True)]
        out[f"{n}_over_{d}"] = round(statistics.median(ratios), 3)
    out.update({f"{n}_prompt_tokens": read[n] for n in names})
    if engine is not None:
        out.update({f"{n}_cached_share": round(statistics.median(cached[n]), 3) for n in names})
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-base-trail")
    p.add_argument("--backends", nargs="+", default=["static"], choices=("static", "vllm"))
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--turns", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--action_tokens", type=int, default=6)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--vllm_block_size", type=int, default=32, help="vLLM's KV-cache block (0: its default)"
    )
    p.add_argument(
        "--env_step_ms", type=float, default=0.0,
        help="with > 0: also play the turns through the episode runner on an environment whose "
        "steps take this long, without and with --env_overlap",
    )  # fmt: skip
    p.add_argument("--overlap", type=int, default=2, help="--env_overlap of env_overlap")
    args = p.parse_args(argv)

    from marlhf.models.config import VLLMConfig
    from marlhf.models.generation import SamplingConfig
    from marlhf.models.load import resolve_model_path

    path = resolve_model_path(args.model)
    layout = _layout(path)
    prompts, context = _prompts(layout, args.batch)
    m, longest = args.action_tokens, max(args.turns)
    max_len = len(prompts[0]) + longest * (m + len(context)) + 1
    res: dict = {
        "model": args.model,
        "batch": args.batch,
        "prompt_tokens": len(prompts[0]),
        "context_tokens": len(context),
        "action_tokens": m,
        "threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "env_step_ms": args.env_step_ms,
        "overlap": args.overlap,
    }
    print(
        f"{args.model}: batch {args.batch}, prompts of {len(prompts[0])} tokens, {m} action "
        f"tokens per turn, contexts of {len(context)} tokens, {args.repeats} repeats"
    )
    for name in args.backends:
        if name == "vllm" and find_spec("vllm") is None:
            res["vllm_error"] = "vLLM is not installed (run with .venv-vllm/bin/python)"
            continue
        cfg = SamplingConfig(
            # vLLM's context holds the longest conversation (multi-turn PPO's --max_prompt_seq_len)
            max_prompt_seq_len=len(prompts[0]) if name == "static" else max_len,
            max_answer_seq_len=m,
            temperature=args.temperature,
            top_k=0,
            generation_backend=name,
            vllm=VLLMConfig(vllm_block_size=args.vllm_block_size),
        )
        sampler = _sampler(name, path, cfg, args.batch)
        engine = getattr(sampler, "engine", None)
        for turns in args.turns:
            ways = _ways(sampler, prompts, context, turns, m, cfg)
            if args.env_step_ms > 0:
                ways.update(_env_ways(sampler, prompts, context, turns, m, cfg,
                                      args.env_step_ms, args.overlap))  # fmt: skip
            r = measure(ways, args.repeats, engine)
            res[f"{name}_k{turns}"] = r
            print(
                f"{name:6s} k={turns}: continue {r['continue_s']:.3f} s, reread "
                f"{r['reread_s']:.3f} s, single {r['single_s']:.3f} s, single_all_tokens "
                f"{r['single_all_tokens_s']:.3f} s; continue/single "
                f"{r['continue_over_single']:.3f}, reread/single {r['reread_over_single']:.3f}, "
                f"continue/single_all_tokens {r['continue_over_single_all_tokens']:.3f}; "
                f"prompt tokens read {r['continue_prompt_tokens']} vs "
                f"{r['reread_prompt_tokens']}"
                + (f"; cached share {r['continue_cached_share']:.2f}" if engine else "")
            )
            if args.env_step_ms > 0:
                print(
                    f"{name:6s} k={turns}, steps of {args.env_step_ms:g} ms: env {r['env_s']:.3f} "
                    f"s, env_overlap ({args.overlap} groups) {r['env_overlap_s']:.3f} s; "
                    f"env/single {r['env_over_single']:.3f}, env_overlap/single "
                    f"{r['env_overlap_over_single']:.3f}, env_overlap/env "
                    f"{r['env_overlap_over_env']:.3f}"
                )
        sampler.close()
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
