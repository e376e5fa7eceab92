"""Time the macro-action core on CPU: each termination rule, build_segments and macro_advantages.

    .venv/bin/python benchmarks/bench_macro.py [--batch 64] [--length 512] [--repeats 7] \
        [--parse_workers 2] [--skip_parsing] [--ppo_metrics RUN/metrics.jsonl]

Prints the median wall time (ms) per call for a random right-padded batch (B, A), and for the
``parsing`` rule on real responses: B rows of A tokens (full length, no EOS: the worst case) of

- **text**: the bundled synthetic TL;DR posts and summaries (`marlhf/data/bundled/synthetic_tldr.jsonl`)
  tokenized with the tiny model's tokenizer (`marlhf.tiny`), parsed by a stand-in for a parser that
  needs no model (`ShallowBackend`: sentences, clauses, words — what the rule costs around a parser)
  and, when spaCy is installed, by spaCy's dependency parser untrained (`untrained_spacy_backend`: the
  network of a spaCy parser, so the cost of a parse; its trees are meaningless). benepar and the
  trained spaCy pipelines cannot be downloaded offline and are not measured;
- **code**: Python standard-library functions, cut to A tokens, with the real ``python`` backend;

each in this process (``--parse_workers 0``) and in a pool of ``--parse_workers`` processes, per batch
and per row. With ``--ppo_metrics RUN/metrics.jsonl`` (any MA-PPO run, e.g. from
``benchmarks/bench_ppo.py --workdir W --responses A``: ``W/ours-A/metrics.jsonl``) each time is also printed as a
fraction of that run's median PPO step (``time/step`` over steps 2..N; step 1 pays one-off costs), and
the run's rollout shape is printed next to it: pass --batch/--length to match it. The last line is
JSON with every figure.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from marlhf.algo.macro_gae import macro_advantages
from marlhf.macro import (
    MacroConfig,
    TerminationInputs,
    build_segments,
    build_termination,
)
from marlhf.macro.parsing import Node, ParsingRule, PythonBackend, SpacyBackend, split_sentences


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def make_inputs(B: int, A: int, seed: int = 0) -> TerminationInputs:
    g = torch.Generator().manual_seed(seed)
    n_valid = torch.randint(A // 4, A + 1, (B,), generator=g)
    mask = torch.arange(A)[None, :] < n_valid[:, None]
    return TerminationInputs(
        response_ids=torch.randint(0, 32000, (B, A), generator=g),
        action_mask=mask,
        ends_with_eos=torch.rand(B, generator=g) < 0.8,
        ref_logprobs=-torch.rand(B, A, generator=g) * 5,
        ref_entropy=torch.rand(B, A, generator=g) * 4,
        generator=g,
    )


def bench_macro_core(B: int = 64, A: int = 512, repeats: int = 7) -> dict[str, float]:
    """Median ms per call of each rule, build_segments and macro_advantages on a (B, A) batch."""
    inputs = make_inputs(B, A)
    configs = {
        "fixed (n=5)": MacroConfig(termination_condition="fixed", ngram=5),
        "randomized (original)": MacroConfig(termination_condition="randomized"),
        "randomized (resample)": MacroConfig(
            termination_condition="randomized", randomized_mode="resample"
        ),
        "ppl": MacroConfig(termination_condition="ppl"),
        "entropy (tau=2)": MacroConfig(termination_condition="entropy"),
        "entropy (target 5)": MacroConfig(termination_condition="entropy", target_macro_len=5.0),
    }
    results = {}
    for name, cfg in configs.items():
        rule = build_termination(cfg)
        results[f"rule: {name}"] = median_ms(lambda rule=rule: rule(inputs), repeats)
    macro_end = build_termination(configs["fixed (n=5)"])(inputs).macro_end
    results["build_segments"] = median_ms(
        lambda: build_segments(macro_end, inputs.action_mask), repeats
    )
    seg = build_segments(macro_end, inputs.action_mask)
    rewards = torch.randn(B, A)
    values = torch.randn(B, A)
    results["macro_advantages (n=5)"] = median_ms(
        lambda: macro_advantages(rewards, values, inputs.action_mask, seg, gamma=1.0, lam=0.95),
        repeats,
    )
    seg1 = build_segments(inputs.action_mask.clone(), inputs.action_mask)
    results["macro_advantages (n=1)"] = median_ms(
        lambda: macro_advantages(rewards, values, inputs.action_mask, seg1, gamma=1.0, lam=0.95),
        repeats,
    )
    return results


# --------------------------------------------------------------------------------------------------
# the parsing rule on real responses

# Standard-library modules whose functions stand in for generated code (APPS-style solutions).
CODE_MODULES = ("textwrap", "difflib", "statistics", "fractions", "heapq", "bisect", "shlex")


class ShallowBackend:
    """A stand-in for a parser that needs no model: each sentence (`split_sentences`) is a node, its
    clauses (split after , ; :) are its children and its words and punctuation marks their leaves.
    Timing the rule with it measures everything around the parser (offsets, sentence splitting, the
    macro-action DFS, the token mapping)."""

    def parse(self, text: str) -> list[Node]:
        trees = []
        for s, e in split_sentences(text):
            clauses, start = [], s
            for m in re.finditer(r"[,;:](?=\s)|$", text[s:e]):
                end = s + m.end()
                words = [
                    Node(start + w.start(), start + w.end())
                    for w in re.finditer(r"\w+|[^\w\s]", text[start:end])
                ]
                if words:
                    clauses.append(Node(words[0].start, words[-1].end, words, "clause"))
                start = end
            if clauses:
                trees.append(Node(clauses[0].start, clauses[-1].end, clauses, "S"))
        return trees


def untrained_spacy_backend() -> SpacyBackend:
    """spaCy's default dependency parser (a HashEmbedCNN tok2vec, width 96, depth 4, and the
    transition parser), initialised untrained from one hand-annotated sentence: the cost of a parse
    by a spaCy-sized network, no model download; the trees it gives are meaningless."""
    import spacy
    from spacy.training import Example

    nlp = spacy.blank("en")
    nlp.add_pipe("parser")
    doc = nlp.make_doc("The cat sat on the mat.")
    heads, deps = [1, 2, 2, 2, 5, 3, 2], ["det", "nsubj", "ROOT", "prep", "det", "pobj", "punct"]
    nlp.initialize(lambda: [Example.from_dict(doc, {"heads": heads, "deps": deps})])
    return SpacyBackend(nlp=nlp)


def _tiny_tokenizer():
    from transformers import AutoTokenizer

    from marlhf.models.zoo import ensure_tiny

    return AutoTokenizer.from_pretrained(ensure_tiny())


def _rows(tokenizer, texts: list[str], B: int, A: int, sep: str) -> list[list[int]]:
    """B rows of exactly A tokens: row b is texts[b], texts[b+1], ... joined by `sep`, cut."""
    encoded = [tokenizer.encode(t + sep, add_special_tokens=False) for t in texts]
    rows = []
    for b in range(B):
        row: list[int] = []
        i = b
        while len(row) < A:
            row.extend(encoded[i % len(encoded)])
            i += 1
        rows.append(row[:A])
    return rows


def text_rows(tokenizer, B: int, A: int) -> list[list[int]]:
    """Posts, each followed by its summaries, of the bundled synthetic TL;DR data."""
    from marlhf.models.zoo import bundled_corpus_path

    texts = []
    with open(bundled_corpus_path(), encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            summaries = " ".join(s["text"] + "." for s in row.get("summaries") or [])
            texts.append(f"{row['info']['post']}\nTL;DR: {summaries}")
    return _rows(tokenizer, texts, B, A, "\n\n")


def code_rows(tokenizer, B: int, A: int) -> list[list[int]]:
    """Top-level functions and classes of some standard-library modules, without their docstrings
    (``ast.unparse``: plain code, like a generated solution)."""
    import ast
    import importlib
    import inspect

    texts = []
    for name in CODE_MODULES:
        for node in ast.parse(inspect.getsource(importlib.import_module(name))).body:
            if not isinstance(node, ast.FunctionDef | ast.ClassDef):
                continue
            for sub in ast.walk(node):
                body = getattr(sub, "body", None)
                if (
                    isinstance(sub, ast.FunctionDef | ast.ClassDef)
                    and len(body) > 1
                    and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                ):
                    del body[0]
            texts.append(ast.unparse(node))
    return _rows(tokenizer, texts, B, A, "\n\n\n")


def _batch(rows: list[list[int]]) -> TerminationInputs:
    ids = torch.tensor(rows, dtype=torch.long)
    return TerminationInputs(
        response_ids=ids,
        action_mask=torch.ones_like(ids, dtype=torch.bool),
        ends_with_eos=torch.zeros(ids.shape[0], dtype=torch.bool),
    )


def bench_parsing(
    B: int, A: int, workers: int, repeats: int, cutoff: int = 5
) -> tuple[dict[str, float], dict[str, int]]:
    """Median ms per batch of the parsing rule on (B, A) text and code rows, in this process and
    with `workers` processes; and the number of rows that fell back to fixed n-grams per case."""
    tokenizer = _tiny_tokenizer()
    text, code = _batch(text_rows(tokenizer, B, A)), _batch(code_rows(tokenizer, B, A))
    cases: list[tuple[str, TerminationInputs, Callable]] = [
        ("text, shallow stand-in", text, ShallowBackend),
        ("code, python", code, PythonBackend),
    ]
    try:
        import spacy  # noqa: F401

        cases.insert(1, ("text, spaCy parser (untrained)", text, untrained_spacy_backend))
    except ImportError:
        print("spaCy is not installed: the spaCy case is skipped")
    times: dict[str, float] = {}
    fallbacks: dict[str, int] = {}
    for name, inputs, factory in cases:
        for w in sorted({0, workers}):
            cfg = MacroConfig(
                termination_condition="parsing", parsing_cutoff=cutoff, parse_workers=w
            )
            rule = ParsingRule(cfg, tokenizer, backend_factory=factory)
            key = f"parsing: {name}, " + (f"{w} workers" if w else "in process")
            try:
                times[key] = median_ms(lambda rule=rule, inputs=inputs: rule(inputs), repeats)
                fallbacks[key] = int(rule(inputs).fallback.sum())
            finally:
                rule.close()
    return times, fallbacks


def ppo_run(metrics_path: str) -> dict:
    """Median ``time/step`` (s) over steps 2..N of a PPO run's metrics.jsonl (all steps when there
    is one), its mean response length, and its rollout shape from ``actor/run_config.json``."""
    with open(metrics_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if r.get("time/step")]
    if not rows:
        raise SystemExit(f"{metrics_path}: no time/step rows")
    timed = rows[1:] if len(rows) > 1 else rows
    run = {
        "step_s": statistics.median(r["time/step"] for r in timed),
        "steps": len(timed),
        "response_len": statistics.mean(r.get("response/length", 0.0) for r in timed),
    }
    config = Path(metrics_path).parent / "actor" / "run_config.json"
    if config.exists():
        gen = json.loads(config.read_text()).get("generation", {})
        run["rollout_rows"] = gen.get("per_device_generation_batch_size", 0) * gen.get(
            "generation_batches", 1
        )
        run["max_answer_len"] = gen.get("max_answer_seq_len")
    return run


def ppo_step_fraction(macro_ms: dict[str, float], step_s: float) -> dict[str, float]:
    """Fraction of one PPO step per timed operation."""
    return {name: ms / (1000.0 * step_s) for name, ms in macro_ms.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument(
        "--ppo_metrics", default=None, help="metrics.jsonl of a PPO run to relate to"
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--parse_workers", type=int, default=2, help="processes for the pooled parsing case"
    )
    parser.add_argument("--parsing_cutoff", type=int, default=5)
    parser.add_argument("--skip_parsing", action="store_true", help="only the random-batch core")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    B, A = args.batch, args.length
    results = bench_macro_core(B, A, args.repeats)
    fallbacks: dict[str, int] = {}
    if not args.skip_parsing:
        parsed, fallbacks = bench_parsing(
            B, A, args.parse_workers, args.repeats, args.parsing_cutoff
        )
        results.update(parsed)
    run = ppo_run(args.ppo_metrics) if args.ppo_metrics else None
    fractions = ppo_step_fraction(results, run["step_s"]) if run else {}
    print(
        f"macro-action core, B={B} A={A}, CPU, {args.threads} thread(s), median of {args.repeats}"
    )
    if run:
        print(
            f"PPO run {args.ppo_metrics}: {run['step_s']:.3f} s/step (median of {run['steps']}), "
            f"rollout {run.get('rollout_rows', '?')} rows, answers <= "
            f"{run.get('max_answer_len', '?')} tokens (mean {run['response_len']:.1f})"
        )
    width = max(len(k) for k in results)
    header = f"{'operation':<{width}}  {'ms/batch':>9}  {'ms/row':>7}"
    print(header + ("  % of PPO step" if run else ""))
    for name, ms in results.items():
        line = f"{name:<{width}}  {ms:9.2f}  {ms / B:7.3f}"
        if run:
            line += f"  {100 * fractions[name]:13.2f}"
        print(line)
    if fallbacks and any(fallbacks.values()):
        print("rows that fell back to fixed n-grams:", {k: v for k, v in fallbacks.items() if v})
    print(
        json.dumps(
            {
                "batch": B,
                "length": A,
                "ms": results,
                "fallbacks": fallbacks,
                "ppo_run": run,
                "fraction_of_ppo_step": fractions,
            }
        )
    )


if __name__ == "__main__":
    main()
