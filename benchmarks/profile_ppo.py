"""Where a PPO step's time goes: per phase and per model, forward / log-probs / backward / optimiser,
split into matrix products, softmax work, copies and indexing, host syncs and Python overhead.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/profile_ppo.py --batch 16 --minibatch 8 --response 256
    .venv/bin/python benchmarks/profile_ppo.py --response 256 -- --recompute_old_logprobs   # stage flags

Builds the same models as ``bench_ppo.py`` (tiny Gemma and a reward model on it), runs the stage's own
``setup`` and ``ppo_step`` in this process (fixed 5-gram macro actions, one PPO epoch, temperature 0.8,
no top-k), and labels every call of the four engines (forward, backward, optimiser step), the
log-prob / entropy computation and the decode loop. After ``--warmup`` steps it times ``--steps``
steps (median wall ms per label, no profiler) and then profiles one more step with
``torch.profiler``; each label's op time is split by the ops' own (self) CPU time into

- ``matmul``: linear layers and attention (mm, addmm, bmm, sdpa, ...);
- ``softmax``: log-softmax, logsumexp, softmax, exp, entropy arithmetic;
- ``copy/index``: copies, casts, cat, gather/scatter, indexing, padding, embeddings;
- ``sync``: ``.item()`` / ``bool(tensor)`` (``aten::_local_scalar_dense``), with the call count;
- ``other``: every other op (elementwise, reductions, optimiser arithmetic, ...);

and ``python`` = the label's profiled wall time minus its ops' time (interpreter, module dispatch,
hooks; inflated by the profiler's own cost, so read it as an upper bound). Prints a Markdown table;
the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

CATEGORIES = {
    "matmul": ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "dot", "_scaled_dot_product"),
    "softmax": ("softmax", "log_softmax", "logsumexp", "exp", "log", "_softmax", "_log_softmax"),
    "copy/index": (
        "copy_", "clone", "contiguous", "cat", "to", "_to_copy", "gather", "scatter", "index",
        "index_select", "embedding", "constant_pad_nd", "pad", "masked_fill", "where", "expand",
        "_unsafe_view", "reshape", "view", "slice", "select", "narrow", "empty", "zeros", "full",
        "fill_", "zero_", "stack", "sort", "take_along_dim", "repeat",
    ),
    "sync": ("_local_scalar_dense", "item", "is_nonzero"),
}  # fmt: skip


def category(name: str) -> str | None:
    """The category of a profiled event name, or None when it is not an op (a label, a hook)."""
    if "::" not in name:
        return None
    base = name.split("::", 1)[1]
    for cat, names in CATEGORIES.items():
        if base in names or (cat == "matmul" and base.startswith("_scaled_dot_product")):
            return cat
    return "other"


class Labels:
    """Wall time per label (summed over a step) and ``torch.profiler.record_function`` scopes."""

    def __init__(self) -> None:
        self.phase = "other"
        self.model = "-"
        self.times: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    @contextmanager
    def __call__(self, part: str, model: str | None = None):
        import torch

        if model is not None:
            self.model = model
        key = f"{self.phase}|{self.model}|{part}"
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.profiler.record_function("L:" + key):
            yield
        self.times[key] += time.perf_counter() - t0
        self.cpu[key] += time.process_time() - c0
        self.calls[key] += 1

    def wrap(self, fn, part: str, model: str | None = None):
        def inner(*a, **k):
            with self(part, model):
                return fn(*a, **k)

        return inner

    def phase_wrap(self, fn, phase: str):
        def inner(*a, **k):
            before, self.phase = self.phase, phase
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                self.phase = before
                self.times["phase:" + phase] += time.perf_counter() - t0
                self.cpu["phase:" + phase] += time.process_time() - c0

        return inner


def instrument(run, labels: Labels) -> None:
    """Label the engines' calls, the log-prob helpers and the phases of ``marlhf.stages.ppo.loop``."""
    import marlhf.stages.ppo.forward as forward
    import marlhf.stages.ppo.loop as loop

    m = run.models
    for name in ("actor", "ref", "critic", "reward"):
        engine = getattr(m, name)
        if engine is None:
            continue
        engine.forward = labels.wrap(engine.forward, "forward", name)
        if name in ("actor", "critic"):
            engine.backward = labels.wrap(engine.backward, "backward", name)
            engine.step = labels.wrap(engine.step, "optimizer", name)
    for mod in (forward,):
        if hasattr(mod, "response_logprobs_and_entropy"):
            fn = mod.response_logprobs_and_entropy
            mod.response_logprobs_and_entropy = labels.wrap(fn, "logprobs/entropy")
    gen = loop.generate
    loop.generate = labels.phase_wrap(labels.wrap(gen, "decode", "actor"), "generate")
    loop.score = labels.phase_wrap(loop.score, "score")
    # the update's first minibatch's critic pass, run while scoring (--reuse_critic_forward)
    loop.kept_critic_values = labels.phase_wrap(loop.kept_critic_values, "score")
    loop.ppo_update = labels.phase_wrap(loop.ppo_update, "train")
    for fn in ("segment", "token_rewards", "gather_experience", "estimate"):
        setattr(loop, fn, labels.phase_wrap(labels.wrap(getattr(loop, fn), fn, "-"), "macro"))


def op_breakdown(prof) -> dict[str, dict[str, float]]:
    """Per label: its profiled wall µs, self µs of its ops by category, and the sync count."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    events = prof.events()
    for ev in events:
        if ev.name.startswith("L:"):
            out[ev.name[2:]]["wall_us"] += ev.cpu_time_total
    for ev in events:
        cat = category(ev.name)
        if cat is None:
            continue
        p = ev.cpu_parent
        while p is not None and not p.name.startswith("L:"):
            p = p.cpu_parent
        if p is None:
            continue
        d = out[p.name[2:]]
        d[cat] += ev.self_cpu_time_total
        d["op:" + ev.name] += ev.self_cpu_time_total
        if cat == "sync" and ev.name.endswith("_local_scalar_dense"):
            d["syncs"] += 1
    return out


def stage_argv(args, work: Path, actor: Path, rm: Path) -> list[str]:
    return [
        "--actor_model_name_or_path", str(actor), "--critic_model_name_or_path", str(rm),
        "--data_output_path", str(work / "cache"), "--max_prompt_seq_len", str(args.prompt),
        "--max_answer_seq_len", str(args.response),
        "--per_device_generation_batch_size", str(args.batch),
        "--per_device_training_batch_size", str(args.minibatch), "--ppo_epochs", "1",
        "--max_steps", "1000", "--temperature", "0.8", "--top_k", "0",
        "--termination_condition", "fixed", "--ngram", "5", "--output_dir", str(work / "run"),
        "--disable_progress_bar", *args.extra,
    ]  # fmt: skip


def table(labels: Labels, walls: dict[str, list[float]], ops: dict) -> list[dict]:
    rows = []
    step_ms = statistics.median(walls["step"]) * 1e3
    step_cpu = statistics.median(walls["step_cpu"]) * 1e3
    for key in sorted(k for k in walls if "|" in k and not k.startswith("cpu|")):
        phase, model, part = key.split("|")
        ms = statistics.median(walls[key]) * 1e3
        cpu_ms = statistics.median(walls["cpu|" + key]) * 1e3
        o = ops.get(key, {})
        prof_ms = o.get("wall_us", 0.0) / 1e3
        cats = {c: o.get(c, 0.0) / 1e3 for c in CATEGORIES}
        cats["other"] = o.get("other", 0.0) / 1e3
        op_ms = sum(cats.values())
        rows.append(
            {
                "phase": phase,
                "model": model,
                "part": part,
                "calls": labels.calls[key],
                "ms": ms,
                "pct_step": 100 * ms / step_ms,
                "cpu_ms": cpu_ms,
                "pct_step_cpu": 100 * cpu_ms / step_cpu,
                "profiled_ms": prof_ms,
                **{f"{c}_ms": v for c, v in cats.items()},
                "python_ms": max(0.0, prof_ms - op_ms),
                "syncs": int(o.get("syncs", 0)),
            }
        )
    return rows


def set_flags(cfg, spec: str) -> None:
    """Set ``name=value,...`` on whichever part of the stage config has the field ``name``."""
    import dataclasses

    for item in filter(None, spec.split(",")):
        name, value = item.split("=", 1)
        for part in dataclasses.fields(cfg):
            obj = getattr(cfg, part.name)
            if hasattr(obj, name):
                old = getattr(obj, name)
                typed = (
                    value.lower() in ("1", "true") if isinstance(old, bool) else type(old)(value)
                )
                setattr(obj, name, typed)
                break
        else:
            raise SystemExit(f"no stage field {name!r}")


def ab(run, cfg, state, labels: Labels, variants: list[str], rounds: int) -> dict:
    """Alternate the variants step by step (``name:field=value,...``, set on the parts of ``cfg``,
    the stage config ``run`` was set up from) and report each one's median wall and CPU seconds per
    phase: the machine's load hits all variants alike."""
    from dataclasses import replace

    from marlhf.stages.ppo.loop import ppo_step

    base = {}
    for v in variants:
        for item in filter(None, v.split(":", 1)[1].split(",")):
            name = item.split("=", 1)[0]
            for part in ("generation", "perf", "ppo", "models"):
                if hasattr(getattr(cfg, part), name):
                    base.setdefault(name, (part, getattr(getattr(cfg, part), name)))
    res: dict[str, dict[str, list[float]]] = {v.split(":")[0]: defaultdict(list) for v in variants}
    for _ in range(rounds):
        for v in variants:
            name, spec = v.split(":", 1)
            for field_name, (part, value) in base.items():
                setattr(getattr(cfg, part), field_name, value)
            set_flags(cfg, spec)
            run = replace(run, trainer=cfg.trainer)  # the run holds cfg's parts; these are derived
            labels.times.clear()
            labels.cpu.clear()
            t, c = time.perf_counter(), time.process_time()
            metrics = ppo_step(run, state)[0]
            r = res[name]
            r["step_wall"].append(time.perf_counter() - t)
            r["step_cpu"].append(time.process_time() - c)
            r["response"].append(metrics["response/length"])
            for k in labels.times:
                if k.startswith("phase:"):
                    r[k[6:] + "_wall"].append(labels.times[k])
                    r[k[6:] + "_cpu"].append(labels.cpu[k])
    out = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in res.items()}
    first = next(iter(out.values()))
    print(
        f"| variant | step wall s | step CPU s | generate CPU | score CPU | train CPU | "
        f"CPU vs {variants[0].split(':')[0]} | mean response |\n|---|---|---|---|---|---|---|---|"
    )
    for n, r in out.items():
        print(
            f"| {n} | {r['step_wall']:.3f} | {r['step_cpu']:.3f} | {r.get('generate_cpu', 0):.3f} | "
            f"{r.get('score_cpu', 0):.3f} | {r.get('train_cpu', 0):.3f} | "
            f"{first['step_cpu'] / r['step_cpu']:.2f}x | {r['response']:.0f} |"
        )
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--minibatch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=160)
    p.add_argument("--response", type=int, default=256)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3, help="timed steps (no profiler)")
    p.add_argument("--workdir", default=None)
    p.add_argument("--trace", default=None, help="also write a Chrome trace of the profiled step")
    p.add_argument("--top", type=int, default=0, help="print each label's N costliest ops")
    p.add_argument(
        "--ab",
        nargs="+",
        default=None,
        help="variants name:field=value,... alternated step by step (A/B under load)",
    )
    p.add_argument("--rounds", type=int, default=4, help="steps per variant with --ab")
    p.add_argument("extra", nargs="*", help="stage flags after --")
    args = p.parse_args(argv)

    import torch
    from bench_ppo import build_models

    from marlhf.cli import parse_config
    from marlhf.stages.ppo.config import PPOStageConfig
    from marlhf.stages.ppo.loop import ppo_step, setup
    from marlhf.stages.ppo.state import resume

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="profile_ppo_"))
    work.mkdir(parents=True, exist_ok=True)
    actor, rm = build_models(work, None, "gemma")
    cfg = parse_config(PPOStageConfig, stage_argv(args, work, actor, rm))
    run = setup(cfg)
    state = resume(run.models, run.ppo, run.log, run.models_cfg, run.out)
    labels = Labels()
    instrument(run, labels)
    for _ in range(args.warmup):
        ppo_step(run, state)
    if args.ab:
        out = ab(run, cfg, state, labels, args.ab, args.rounds)
        print(json.dumps(out))
        return out
    walls: dict[str, list[float]] = defaultdict(list)
    resp = []
    for _ in range(args.steps):
        labels.times.clear()
        labels.calls.clear()
        labels.cpu.clear()
        t, c = time.perf_counter(), time.process_time()
        metrics = ppo_step(run, state)[0]
        walls["step"].append(time.perf_counter() - t)
        walls["step_cpu"].append(time.process_time() - c)
        resp.append(metrics["response/length"])
        for k, v in labels.times.items():
            walls[k].append(v)
            walls["cpu|" + k].append(labels.cpu[k])
    from torch.profiler import ProfilerActivity, profile

    calls = dict(labels.calls)  # of the last timed step
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ppo_step(run, state)
    if args.trace:
        prof.export_chrome_trace(args.trace)
    ops = op_breakdown(prof)
    labels.calls = calls
    rows = table(labels, walls, ops)
    step_ms = statistics.median(walls["step"]) * 1e3
    step_cpu = statistics.median(walls["step_cpu"]) * 1e3
    print(
        f"batch {args.batch}, minibatch {args.minibatch}, response {args.response} "
        f"(mean {statistics.mean(resp):.0f}), torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}: step {step_ms:.0f} ms wall, {step_cpu:.0f} ms CPU "
        f"(median of {args.steps}); op columns: ms of the profiled step"
    )
    cols = ("matmul", "softmax", "copy/index", "sync", "other")
    print(
        "| phase | model | part | calls | CPU ms | % step | wall ms | "
        + " | ".join(cols)
        + " | python | syncs |\n|"
        + "---|" * (10 + len(cols) - 2)
    )
    for r in rows:
        shares = " | ".join(f"{r[f'{c}_ms']:.0f}" for c in cols)
        print(
            f"| {r['phase']} | {r['model']} | {r['part']} | {r['calls']} | {r['cpu_ms']:.0f} | "
            f"{r['pct_step_cpu']:.1f} | {r['ms']:.0f} | {shares} | {r['python_ms']:.0f} | "
            f"{r['syncs']} |"
        )
    for key in sorted(ops) if args.top else ():
        top = sorted(((v, k[3:]) for k, v in ops[key].items() if k.startswith("op:")), reverse=True)
        print(key, "  ".join(f"{n} {v / 1e3:.0f}" for v, n in top[: args.top]))
    out = {"step_ms": step_ms, "step_cpu_ms": step_cpu, "rows": rows, "stage_flags": args.extra}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
