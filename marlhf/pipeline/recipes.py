"""Recipes of the shipped tiny models (:mod:`marlhf.models.zoo`): how ``tiny-base``, the long-horizon
bases ``tiny-base-{16,64,256}``, the arithmetic base ``tiny-base-arith`` and the reward-model base
``tiny-rm-base`` were made, and the figures that describe them. Each recipe runs the project's own
stages as a user would::

    python -m marlhf.tiny --pretrain OUT_DIR                  # tiny-base, ~11 min on 2 CPU cores
    python -m marlhf.tiny --pretrain OUT_DIR --horizon 64     # tiny-base-64
    python -m marlhf.tiny --pretrain OUT_DIR --arith          # tiny-base-arith
    python -m marlhf.tiny --rm_base OUT_DIR                   # ~47 min on 1 thread of 2 loaded cores
    python -m marlhf.tiny --pretrain OUT_DIR --trail          # tiny-base-trail (multi-turn task)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import torch

from marlhf.cli import Parser
from marlhf.data import trail
from marlhf.data.long_tasks import pretraining_rows as long_rows
from marlhf.data.reasoning_tasks import PRETRAIN_FIRST_FLIP, PRETRAIN_SLIP
from marlhf.data.reasoning_tasks import pretraining_rows as arith_rows
from marlhf.data.synthetic import pretraining_rows
from marlhf.models.reward_model import VALUE_HEAD_FILE, RewardModel, save_reward_model
from marlhf.models.zoo import (
    ARITH_NEW_TOKENS,
    BASE_FILES,
    HORIZON_BASE_DIRS,
    HORIZON_NEW_TOKENS,
    TINY_VERSION,
    TRAIL_BASE_FILES,
    TRAIL_NEW_TOKENS,
    build_tiny,
    bundled_corpus_path,
    ensure_horizon_base,
    ensure_tiny_base,
)
from marlhf.pipeline.figures import arith_figures, horizon_figures, trail_figures
from marlhf.pipeline.preference_pretraining import PMPPhase, pretrain
from marlhf.runtime.tracking import read_metrics

# The SFT-stage flags that pretrained the shipped base from `tiny` (the corpus path is added).
PRETRAIN_ROWS = 20000


def lm_flags(max_seq_len: int, batch: int, lr: str, epochs: int) -> tuple[str, ...]:
    """The SFT-stage flags of the embedded models' language-model recipes (all data in the SFT
    phase, cosine schedule, 3 % warm-up, ZeRO-0, seed 1234)."""
    return (
        "--data_split", "10,0,0",
        "--max_seq_len", str(max_seq_len),
        "--per_device_train_batch_size", str(batch),
        "--per_device_eval_batch_size", str(batch),
        "--learning_rate", lr,
        "--num_train_epochs", str(epochs),
        "--warmup_ratio", "0.03",
        "--lr_scheduler_type", "cosine",
        "--zero_stage", "0",
        "--eval_iters", "4",
        "--seed", "1234",
    )  # fmt: skip


PRETRAIN_FLAGS = lm_flags(192, 32, "3e-3", 2)

# The pretrained bases of the long-horizon tasks (``marlhf.data.long_tasks``): ``tiny-base-{16,64,256}``,
# the shape and tokenizer of ``tiny-base``, pretrained further on both tasks of one horizon: 16 and 64
# from ``tiny-base``, 256 from ``tiny-base-64`` (long copying is learnt far cheaper on 64-token
# answers; a 2-layer model trained on 256-token answers from ``tiny-base`` loops and repeats).
HORIZON_START = {16: "tiny-base", 64: "tiny-base", 256: "tiny-base-64"}
# RoPE: raising the context adds no weights; a 256-task prompt + answer is under 800 tokens.
HORIZON_MAX_POSITIONS = 1024
HORIZON_ROWS = {16: 6000, 64: 18000, 256: 12000}
HORIZON_FLAGS = {
    h: lm_flags(seq, batch, lr, 1)
    for h, seq, batch, lr in ((16, 192, 32, "2e-3"), (64, 320, 32, "2e-3"), (256, 800, 16, "2e-3"))
}
# The base of the multi-step arithmetic tasks (``marlhf.data.reasoning_tasks``): ``tiny-base-arith``,
# the shape and tokenizer of ``tiny-base`` pretrained further on worked solutions of 2-16 steps, a
# share of whose lines slip and half of whose first lines apply the other operation
# (``reasoning_tasks.pretraining_rows``), for two epochs. The longest prompt and solution take 336
# tokens.
ARITH_START = "tiny-base"
ARITH_ROWS = 16000
ARITH_FLAGS = lm_flags(480, 16, "2e-3", 2)
ARITH_FIGURE_PROMPTS = 64  # held-out problems per task in the recorded figures


def pretrain_base(
    out_dir: str | Path,
    rows: int | None = None,
    extra_flags: Iterable[str] = (),
    workdir: str | Path | None = None,
    horizon: int | None = None,
    arith: bool = False,
    figure_prompts: int = ARITH_FIGURE_PROMPTS,
) -> Path:
    """Make ``tiny-base``: pretrain ``tiny`` on ``rows`` (default ``PRETRAIN_ROWS``) generated posts
    with the SFT stage; with ``horizon``, make ``tiny-base-{horizon}`` instead (``_horizon_setup``);
    with ``arith``, ``tiny-base-arith`` (from ``tiny-base``; its figures on ``figure_prompts``
    held-out problems per task).

    Runs ``python -m marlhf.stages.sft`` (a subprocess, like a user would) with ``PRETRAIN_FLAGS``
    plus ``extra_flags`` (later flags win, e.g. ``--max_steps 2`` for a smoke test) in ``workdir``
    (default: a temporary directory), then copies the model, its tokenizer and ``pretraining.json``
    (recipe and final eval perplexity) into ``out_dir``.
    """

    if horizon is not None and arith:
        raise ValueError("--horizon and --arith make different bases: pass one")
    if horizon is not None:
        rows = HORIZON_ROWS[horizon] if rows is None else rows
    if arith:
        rows = ARITH_ROWS if rows is None else rows
    rows = PRETRAIN_ROWS if rows is None else rows
    out = Path(out_dir)
    tmp = None
    if workdir is None:
        tmp = tempfile.mkdtemp(prefix="tiny-pretrain-")
        workdir = tmp
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    try:
        corpus = work / "pretrain.jsonl"
        start, base_flags, corpus_rows = "tiny", PRETRAIN_FLAGS, pretraining_rows
        if horizon is not None:
            start, base_flags, corpus_rows = _horizon_setup(work, horizon)
        if arith:
            start = _start_copy(work, ensure_tiny_base(), ARITH_NEW_TOKENS)
            base_flags, corpus_rows = ARITH_FLAGS, arith_rows
        with open(corpus, "w", encoding="utf-8") as f:
            for row in corpus_rows(rows):
                f.write(json.dumps(row) + "\n")
        flags = [*base_flags, *extra_flags]
        cmd = [
            sys.executable, "-m", "marlhf.stages.sft",
            "--model_name_or_path", start,
            "--data_path", str(corpus),
            "--data_output_path", str(work / "cache"),
            "--output_dir", str(work / "run"),
            *flags,
        ]  # fmt: skip
        t0 = time.time()
        subprocess.run(cmd, check=True)
        wall_s = time.time() - t0
        out.mkdir(parents=True, exist_ok=True)
        for name in (*BASE_FILES, "tokenizer_config.json"):
            shutil.copy2(work / "run" / name, out / name)
        with open(work / "run" / "metrics.jsonl") as f:
            evals = [r for r in map(json.loads, f) if "eval/ppl" in r]
        record = {
            "recipe": "python -m marlhf.tiny --pretrain OUT_DIR",
            "corpus": f"marlhf.data.synthetic.pretraining_rows({rows}, seed=0)",
            "base": f"tiny (random init, TINY_VERSION {TINY_VERSION})",
            "sft_flags": flags,
            "final_eval_ppl": evals[-1]["eval/ppl"] if evals else None,
            "steps": evals[-1]["step"] if evals else None,
        }
        if horizon is not None:
            record.update(_horizon_finish(out, rows, horizon, wall_s))
        if arith:
            record.update(_arith_finish(out, rows, wall_s, figure_prompts))
        (out / "pretraining.json").write_text(json.dumps(record, indent=2) + "\n")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _horizon_setup(work: Path, horizon: int):
    """Start model, SFT flags and corpus of ``tiny-base-{horizon}``: a copy of
    ``HORIZON_START[horizon]`` whose config and tokenizer allow ``HORIZON_MAX_POSITIONS`` tokens
    (RoPE: the weights are unchanged), ``HORIZON_FLAGS[horizon]`` and
    ``long_tasks.pretraining_rows(rows, horizon)``."""
    if horizon not in HORIZON_BASE_DIRS:
        raise ValueError(f"--horizon must be one of {sorted(HORIZON_BASE_DIRS)}, got {horizon}")
    origin = HORIZON_START[horizon]
    origin_dir = ensure_tiny_base() if origin == "tiny-base" else ensure_horizon_base(origin)
    start = _start_copy(work, origin_dir, HORIZON_NEW_TOKENS[horizon])
    return start, HORIZON_FLAGS[horizon], lambda n: long_rows(n, horizon)


def _start_copy(work: Path, origin_dir: str, new_tokens: int) -> str:
    """``work/start``: a copy of the model in ``origin_dir`` whose config and tokenizer allow
    ``HORIZON_MAX_POSITIONS`` tokens (RoPE: the weights are unchanged) and which generates up to
    ``new_tokens`` tokens."""
    start = work / "start"
    start.mkdir(parents=True, exist_ok=True)
    for name in (*BASE_FILES, "tokenizer_config.json"):
        shutil.copy2(Path(origin_dir) / name, start / name)
    for name, key, value in (
        ("config.json", "max_position_embeddings", HORIZON_MAX_POSITIONS),
        ("tokenizer_config.json", "model_max_length", HORIZON_MAX_POSITIONS),
        ("generation_config.json", "max_new_tokens", new_tokens),
    ):
        cfg = json.loads((start / name).read_text())
        cfg[key] = value
        (start / name).write_text(json.dumps(cfg, indent=2) + "\n")
    return str(start)


def _to_bf16(out: Path) -> None:
    """Store the weights in ``out`` in bf16 (they load as fp32: the config says float32)."""
    from safetensors.torch import load_file, save_file

    weights = out / "model.safetensors"
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in load_file(weights).items()}
    save_file(state, weights, metadata={"format": "pt"})
    weights.chmod(0o644)


def _arith_finish(out: Path, rows: int, wall_s: float, prompts: int) -> dict:
    """Store the weights in bf16 and measure the base: the ``pretraining.json`` entries of
    ``tiny-base-arith``."""
    _to_bf16(out)
    return {
        "recipe": "python -m marlhf.tiny --pretrain OUT_DIR --arith",
        "corpus": f"marlhf.data.reasoning_tasks.pretraining_rows({rows}, seed=0, "
        f"slip={PRETRAIN_SLIP}, first_flip={PRETRAIN_FIRST_FLIP})",
        "base": f"{ARITH_START} with max_position_embeddings {HORIZON_MAX_POSITIONS}",
        "stored": "bf16 weights, loaded as fp32",
        "sft_wall_s": round(wall_s, 1),
        "figures": arith_figures(out, prompts),
    }


def _horizon_finish(out: Path, rows: int, horizon: int, wall_s: float) -> dict:
    """Store the weights in bf16 (they load as fp32: the config says float32) and measure the base:
    the ``pretraining.json`` entries of ``tiny-base-{horizon}``."""
    _to_bf16(out)
    return {
        "recipe": f"python -m marlhf.tiny --pretrain OUT_DIR --horizon {horizon}",
        "corpus": f"marlhf.data.long_tasks.pretraining_rows({rows}, horizon={horizon}, seed=0)",
        "base": f"{HORIZON_START[horizon]} with max_position_embeddings {HORIZON_MAX_POSITIONS}",
        "stored": "bf16 weights, loaded as fp32",
        "sft_wall_s": round(wall_s, 1),
        "figures": horizon_figures(out, horizon),
    }


# --- tiny-rm-base: the reward model's base --------------------------------------------------------
# The reward model is larger than the policy (as in InstructGPT, whose RMs were trained from larger
# models than the smallest policies): tiny-base with RM_EXTRA_LAYERS more layers, trained further as an
# LM (1.) and then as a preference model on generated K-wise comparisons (2., "preference-model
# pretraining", Askell et al. 2021; marlhf.pipeline.preference_pretraining) in RM_PMP_PHASES. Why each step,
# with the measurements behind it: docs/research/reward-model.md, "A reward model that learns".
RM_EXTRA_LAYERS = 2
RM_LM_ROWS = (
    20000  # 1. posts with correct summaries: synthetic.pretraining_rows(RM_LM_ROWS, seed=1)
)
RM_LM_FLAGS = lm_flags(192, 32, "1e-3", 1)
# 2. (kinds, steps, lr, posts per step): each step reads `posts` fresh generated posts with one
# candidate of each kind and a Bradley-Terry label for every pair (synthetic.generate_groups, seed
# RM_PMP_SEED + phase). First who did what (binding), then everything, then coverage and length
# (complete vs missing vs verbose), then everything again, and last everything plus off-task word
# salad (synthetic.OFF_TASK_KINDS), which PPO reached and the RM scored above correct summaries
# when it had never seen any, once at lr 3e-4 and once at 1e-4.
_BINDING = ("complete", "reordered", "swapped", "hallucinated")
_COVERAGE = ("complete", "reordered", "missing", "verbose")
_ALL = ("complete", "reordered", "missing", "hallucinated", "swapped", "verbose", "rambling")
RM_PMP_PHASES: tuple[tuple[tuple[str, ...], int, float, int], ...] = (
    (_BINDING, 800, 3e-4, 4),
    (_ALL, 800, 3e-4, 4),
    (_COVERAGE, 300, 3e-4, 6),
    (_ALL, 1600, 3e-4, 4),
    (_ALL + ("salad", "padded"), 800, 3e-4, 3),
    (_ALL + ("salad", "padded"), 800, 1e-4, 3),
)
RM_PMP_SEED = 777
# Before step 2 the single key/value head of tiny-base's multi-query attention is copied into
# RM_KV_HEADS heads (the same function: every query head reads the same copy) that step 2 then
# trains apart, so each attention head can look for something else.
RM_KV_HEADS = 4


def build_rm_init(out_dir: str | Path, extra_layers: int = RM_EXTRA_LAYERS, seed: int = 0) -> Path:
    """tiny-base with ``extra_layers`` more decoder layers on top (seeded normal init, like the HF
    init of a new model), saved as a causal LM with tiny-base's tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    base = ensure_tiny_base()
    config = AutoConfig.from_pretrained(base)
    config.num_hidden_layers += extra_layers
    torch.manual_seed(seed)
    model, info = AutoModelForCausalLM.from_pretrained(
        base, config=config, output_loading_info=True
    )
    new = {k.split(".")[2] for k in info["missing_keys"] if k.startswith("model.layers.")}
    expected = {
        str(i) for i in range(config.num_hidden_layers - extra_layers, config.num_hidden_layers)
    }
    if new != expected or info["unexpected_keys"] or info["mismatched_keys"]:
        raise ValueError(f"{base}: stacking {extra_layers} layers on tiny-base loaded {info}")
    out = Path(out_dir)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def _run_stage(module: str, args: list[str], out: Path, data: str) -> float:
    """``python -m module args`` writing ``out`` (log in ``out.log``); its wall time. A step whose
    ``out/recipe_step.json`` records the same module, arguments and ``data`` (what the data file
    holds) already ran in this work directory and is skipped, so an interrupted recipe resumes."""
    signature = {"module": module, "args": args, "data": data}
    done = out / "recipe_step.json"
    if done.is_file():
        record = json.loads(done.read_text())
        if {k: record.get(k) for k in signature} == signature:
            return float(record["wall_s"])
    t0 = time.time()
    log_file = out.with_suffix(".log")
    with open(log_file, "w") as log:
        proc = subprocess.run(
            [sys.executable, "-m", module, *args], stdout=log, stderr=subprocess.STDOUT
        )
    if proc.returncode != 0:
        tail = "".join(open(log_file).readlines()[-20:])
        raise RuntimeError(f"{module} failed (exit {proc.returncode}); log {log_file}:\n{tail}")
    wall = time.time() - t0
    done.write_text(json.dumps({**signature, "wall_s": wall}, indent=1) + "\n")
    return wall


def _write_jsonl(path: Path, rows: Iterable[dict]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def _export_rm_base(rm_dir: Path, out: Path) -> None:
    """The backbone (bf16 weights, loaded as fp32), value head and tokenizer of a reward-model
    directory as a base-model directory that ``RewardModel``/``AutoModel`` load."""
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    for name in ("model.safetensors", VALUE_HEAD_FILE):
        state = {k: v.to(torch.bfloat16).contiguous() for k, v in load_file(rm_dir / name).items()}
        save_file(state, out / name, metadata={"format": "pt"})
    config = json.loads((rm_dir / "config.json").read_text())
    config["dtype"] = "float32"  # bf16 on disk loads as fp32, like every embedded model
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(rm_dir / name, out / name)


def expand_kv_heads(src: Path, dst: Path, kv_heads: int) -> Path:
    """Copy the model directory ``src`` to ``dst`` with its key/value heads repeated up to
    ``kv_heads`` (grouped-query attention with G groups -> ``kv_heads`` groups). Query head ``i``
    reads key/value head ``i // (heads / kv_heads)``, so repeating each of the ``G`` heads
    ``kv_heads / G`` times in order leaves the function unchanged."""
    from safetensors.torch import load_file, save_file

    config = json.loads((src / "config.json").read_text())
    old, heads, dim = (
        config["num_key_value_heads"],
        config["num_attention_heads"],
        config["head_dim"],
    )
    if kv_heads % old or heads % kv_heads:
        raise ValueError(
            f"{src}: cannot spread {old} key/value heads over {kv_heads} ({heads} query heads)"
        )
    state = load_file(src / "model.safetensors")
    for key, w in state.items():
        if key.endswith(("k_proj.weight", "v_proj.weight")):
            state[key] = w.view(old, dim, -1).repeat_interleave(kv_heads // old, 0).flatten(0, 1)
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, dst / "model.safetensors")
    config["num_key_value_heads"] = kv_heads
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(src / name, dst / name)
    return dst


def preference_pretrain(start: Path, out: Path, phases=RM_PMP_PHASES, seed: int = RM_PMP_SEED):
    """Step 2: a reward model on the backbone of ``start`` (value head seeded with ``seed``) trained
    through ``phases`` (see ``RM_PMP_PHASES``), saved as a reward-model directory ``out``; the
    logged records (held-out accuracy on the bundled comparisons after each phase)."""
    from transformers import AutoTokenizer

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    start = expand_kv_heads(Path(start), Path(out).with_name(Path(out).name + "_init"), RM_KV_HEADS)
    torch.manual_seed(seed)
    model = RewardModel.from_pretrained(start)
    tok = AutoTokenizer.from_pretrained(start)
    with open(bundled_corpus_path()) as f:
        heldout = [r for r in map(json.loads, f) if r["split"] != "train"]
    plan = [PMPPhase(tuple(k), steps, lr, posts) for k, steps, lr, posts in phases]
    records = pretrain(model, tok, plan, seed, heldout)
    save_reward_model(model, tok, out, extra={"preference_pretraining": records})
    return records


def pretrain_rm_base(
    out_dir: str | Path,
    extra_flags: Iterable[str] = (),
    workdir: str | Path | None = None,
    phases=None,
) -> Path:
    """Make ``tiny-rm-base`` (see the comment above ``RM_BASE_DIR``) in ``out_dir``.

    1. :func:`build_rm_init`, then the SFT stage with ``RM_LM_FLAGS`` (and ``extra_flags``, later
       flags win, e.g. ``--max_steps 2`` for a smoke test) on ``RM_LM_ROWS`` generated posts with
       correct summaries (``synthetic.pretraining_rows(RM_LM_ROWS, seed=1)``; tiny-base read seed 0).
    2. :func:`preference_pretrain` through ``phases`` (default ``RM_PMP_PHASES``).
    3. Its backbone and value head (bf16, loaded as fp32) and tokenizer go to ``out_dir`` with
       ``pretraining.json`` (recipe, wall times, figures).
    """

    phases = RM_PMP_PHASES if phases is None else phases
    tmp = tempfile.mkdtemp(prefix="tiny-rm-base-") if workdir is None else None
    work = Path(workdir if workdir is not None else tmp)
    work.mkdir(parents=True, exist_ok=True)
    extra, wall = list(extra_flags), {}
    try:
        build_rm_init(work / "init")
        lm_corpus = f"marlhf.data.synthetic.pretraining_rows({RM_LM_ROWS}, seed=1)"
        data = _write_jsonl(work / "lm.jsonl", pretraining_rows(RM_LM_ROWS, seed=1))
        wall["lm"] = _run_stage(
            "marlhf.stages.sft",
            ["--model_name_or_path", str(work / "init"), "--data_path", str(data)]
            + ["--data_output_path", str(work / "cache"), "--output_dir", str(work / "lm")]
            + [*RM_LM_FLAGS, *extra],
            work / "lm",
            lm_corpus,
        )
        t0 = time.time()
        records = preference_pretrain(work / "lm", work / "pmp", phases)
        wall["pmp"] = time.time() - t0
        out = Path(out_dir)
        _export_rm_base(work / "pmp", out)
        lm_eval = [r for r in read_metrics(work / "lm" / "metrics.jsonl") if "eval/ppl" in r]
        record = {
            "recipe": "python -m marlhf.tiny --rm_base OUT_DIR",
            "base": f"tiny-base + {RM_EXTRA_LAYERS} layers (build_rm_init, seed 0)",
            "lm_corpus": lm_corpus,
            "lm_flags": [*RM_LM_FLAGS, *extra],
            "lm_final_eval_ppl": lm_eval[-1]["eval/ppl"] if lm_eval else None,
            "pmp_phases": [list(p) for p in phases],
            "pmp_seed": RM_PMP_SEED,
            "pmp_heldout": records,
            "stored": "bf16 weights, loaded as fp32; backbone and value head",
            "wall_s": {k: round(v, 1) for k, v in wall.items()},
        }
        (out / "pretraining.json").write_text(json.dumps(record, indent=2) + "\n")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


# --- tiny-base-trail: the base of the multi-turn trail task ---------------------------------------
# tiny-base pretrained further on played games of the trail task (marlhf.data.trail), 2, 4 and 8
# turns in turn, rendered with the task's chat template (which the base's tokenizer carries); the
# SFT stage's loss covers every token after the first prompt, the environment's lines too (an LM
# base; RL trains only the actions).
TRAIL_ROWS = 18000
TRAIL_FLAGS = lm_flags(160, 32, "2e-3", 1)


def _trail_start(work: Path) -> Path:
    """A copy of tiny-base whose tokenizer carries the trail task's chat template and whose
    generation config stops a turn after ``TRAIL_NEW_TOKENS``."""
    from transformers import AutoTokenizer

    start = work / "start"
    start.mkdir(parents=True, exist_ok=True)
    for name in (*BASE_FILES, "tokenizer_config.json"):
        shutil.copy2(Path(ensure_tiny_base()) / name, start / name)
    tok = AutoTokenizer.from_pretrained(start)
    tok.chat_template = trail.CHAT_TEMPLATE
    tok.save_pretrained(start)
    cfg = json.loads((start / "generation_config.json").read_text())
    cfg["max_new_tokens"] = TRAIL_NEW_TOKENS
    (start / "generation_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return start


def trail_corpus(tokenizer, n: int, seed: int = 0) -> list[dict]:
    """``n`` games of ``trail.pretraining_conversations`` as SFT rows ``{"id", "prompt",
    "chosen"}``: the prompt is the first message rendered with the generation prompt (without the
    BOS, which the stage adds), ``chosen`` the rest of the conversation up to its last action (the
    stage appends the end-of-turn token)."""
    bos, eos = tokenizer.bos_token, tokenizer.eos_token
    out = []
    for i, messages in enumerate(trail.pretraining_conversations(n, seed)):
        prompt = tokenizer.apply_chat_template(
            messages[:1], tokenize=False, add_generation_prompt=True
        )
        whole = tokenizer.apply_chat_template(messages, tokenize=False)
        end = eos + "\n"
        if not (prompt.startswith(bos) and whole.startswith(prompt) and whole.endswith(end)):
            raise ValueError(f"the trail template renders game {i} unexpectedly: {whole!r}")
        out.append(
            {"id": i, "prompt": prompt[len(bos) :], "chosen": whole[len(prompt) : -len(end)]}
        )
    return out


def pretrain_trail_base(
    out_dir: str | Path,
    rows: int | None = None,
    extra_flags: Iterable[str] = (),
    workdir: str | Path | None = None,
) -> Path:
    """Make ``tiny-base-trail`` in ``out_dir``: the SFT stage with ``TRAIL_FLAGS`` (and
    ``extra_flags``, later flags win) from :func:`_trail_start` on ``rows`` (default
    ``TRAIL_ROWS``) games of :func:`trail_corpus`; weights stored in bf16, with
    ``pretraining.json`` (recipe, wall time, :func:`trail_figures`)."""
    from transformers import AutoTokenizer

    rows = TRAIL_ROWS if rows is None else rows
    tmp = tempfile.mkdtemp(prefix="tiny-base-trail-") if workdir is None else None
    work = Path(workdir if workdir is not None else tmp)
    work.mkdir(parents=True, exist_ok=True)
    try:
        start = _trail_start(work)
        corpus = f"marlhf.data.trail.pretraining_conversations({rows}, seed=0)"
        data = _write_jsonl(
            work / "trail.jsonl", trail_corpus(AutoTokenizer.from_pretrained(start), rows)
        )
        flags = [*TRAIL_FLAGS, *extra_flags]
        wall = _run_stage(
            "marlhf.stages.sft",
            ["--model_name_or_path", str(start), "--data_path", str(data)]
            + ["--data_output_path", str(work / "cache"), "--output_dir", str(work / "run")]
            + flags,
            work / "run",
            f"{corpus} v{trail.TRAIL_VERSION}",
        )
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name in TRAIL_BASE_FILES:
            shutil.copy2(work / "run" / name, out / name)
        evals = [r for r in read_metrics(work / "run" / "metrics.jsonl") if "eval/ppl" in r]
        record = {
            "recipe": "python -m marlhf.tiny --pretrain OUT_DIR --trail",
            "corpus": corpus,
            "task_version": trail.TRAIL_VERSION,
            "base": f"tiny-base with the trail task's chat template, max_new_tokens {TRAIL_NEW_TOKENS}",
            "sft_flags": flags,
            "final_eval_ppl": evals[-1]["eval/ppl"] if evals else None,
            "steps": evals[-1]["step"] if evals else None,
            **_store_bf16(out),
            "sft_wall_s": round(wall, 1),
            "figures": trail_figures(out),
        }
        (out / "pretraining.json").write_text(json.dumps(record, indent=2) + "\n")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _store_bf16(out: Path) -> dict:
    """The weights of the model in ``out`` stored in bf16 (they load as fp32: the config says so)."""
    from safetensors.torch import load_file, save_file

    weights = out / "model.safetensors"
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in load_file(weights).items()}
    save_file(state, weights, metadata={"format": "pt"})
    weights.chmod(0o644)
    return {"stored": "bf16 weights, loaded as fp32"}


def main(argv: list[str] | None = None) -> None:
    ap = Parser(
        prog="python -m marlhf.tiny",
        description="Build the random tiny model (default) or pretrain tiny-base (--pretrain).",
    )
    ap.add_argument("out_dir")
    ap.add_argument("--pretrain", action="store_true", help="pretrain tiny-base into OUT_DIR")
    ap.add_argument(
        "--rows",
        type=int,
        default=None,
        help="pretraining posts or problems (default: 20000, HORIZON_ROWS or ARITH_ROWS)",
    )
    ap.add_argument("--workdir", default=None, help="keep the pretraining run here")
    ap.add_argument(
        "--horizon",
        type=int,
        default=None,
        choices=sorted(HORIZON_BASE_DIRS),
        help="pretrain tiny-base-HORIZON (long-horizon tasks) from tiny-base instead",
    )
    ap.add_argument(
        "--arith",
        action="store_true",
        help="pretrain tiny-base-arith (multi-step arithmetic tasks) from tiny-base instead",
    )
    ap.add_argument(
        "--trail",
        action="store_true",
        help="pretrain tiny-base-trail (the multi-turn trail task) from tiny-base instead",
    )
    ap.add_argument(
        "--figures",
        action="store_true",
        help="re-measure the figures of the tiny-base-HORIZON (or tiny-base-arith with --arith) "
        "in OUT_DIR (after a scorer change)",
    )
    ap.add_argument(
        "--rm_base",
        action="store_true",
        help="make tiny-rm-base (the reward model's base) in OUT_DIR",
    )
    args, extra = ap.parse_known_args(argv)
    if args.horizon is not None and args.arith:
        ap.error("--horizon and --arith make different bases: pass one")
    if args.trail:
        if (
            args.horizon is not None
            or args.arith
            or args.rm_base
            or not (args.pretrain or args.figures)
        ):
            ap.error(
                "--trail takes --pretrain or --figures, OUT_DIR (and --rows, --workdir, stage flags)"
            )
        if args.figures:
            record_path = Path(args.out_dir) / "pretraining.json"
            record = json.loads(record_path.read_text())
            record["figures"] = trail_figures(args.out_dir)
            record_path.write_text(json.dumps(record, indent=2) + "\n")
            print(json.dumps(record["figures"], indent=2))
            return
        print(pretrain_trail_base(args.out_dir, args.rows, extra, args.workdir))
        return
    if args.figures:
        if (args.horizon is None and not args.arith) or args.pretrain or args.rm_base or extra:
            ap.error("--figures takes OUT_DIR and --horizon, --arith or --trail only")
        record_path = Path(args.out_dir) / "pretraining.json"
        record = json.loads(record_path.read_text())
        if args.arith:
            record["figures"] = arith_figures(args.out_dir)
        else:
            record["figures"] = horizon_figures(args.out_dir, args.horizon)
        record_path.write_text(json.dumps(record, indent=2) + "\n")
        print(json.dumps(record["figures"], indent=2))
        return
    if args.rm_base:
        if args.horizon is not None or args.arith or args.pretrain:
            ap.error("--rm_base takes OUT_DIR (and stage flags) only")
        print(pretrain_rm_base(args.out_dir, extra, args.workdir))
        return
    if (extra or args.horizon is not None or args.arith) and not args.pretrain:
        given = " ".join(extra) or ("--horizon" if args.horizon is not None else "--arith")
        ap.error(f"unrecognised arguments without --pretrain: {given}")
    if args.pretrain:
        print(pretrain_base(args.out_dir, args.rows, extra, args.workdir, args.horizon, args.arith))
    else:
        print(build_tiny(args.out_dir))


if __name__ == "__main__":
    main()
