"""Padded vs packed PPO steps on CPU, over realistic mixes of prompt and answer lengths, one run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_packing.py               # ~10 min
    .venv/bin/python benchmarks/bench_packing.py --mixes half none --rounds 3     # the two goals

The four models of a PPO step (actor, reference, critic, reward model: tiny-base, fp32, one thread,
AdamW) run the stage's own functions: scoring (`marlhf.stages.ppo.scoring.score`: π_old
with its entropy, π_ref, the critic's values, the reward model's scores) and the update
(`marlhf.stages.ppo.update.ppo_update`: one PPO epoch of minibatches, an actor step and a critic
step each) on rollouts of a length mix, and the generate phase decodes the mix's prompts with the
static decoder for as many tokens as its longest answer (what a batch costs the decoder: it runs
until its last row stops). Each mix runs in three layouts:

- ``padded``: `--no_packing --length_groups 1`, one padded rectangle per pass;
- ``grouped``: `--no_packing` (length groups, the padded default: up to 4 passes of rows of
  similar length);
- ``packed``: the default, `--packing` (rows end to end, `marlhf.models.packing`).

Mixes (``--mixes``; B rows per step, minibatch B/2):

- ``tldr``: the bundled synthetic TL;DR prompts (tokenised as the PPO stage does, at most 160
  tokens) with answers sampled from tiny-base at temperature 1, stopping at EOS, at most 40 tokens
  (the demo's PPO settings);
- ``long_tail``: prompts of 16–400 tokens and answers of 1–256 tokens, both log-normal (most rows
  short, a few long);
- ``half``: prompts of 8 tokens, answers of 1–248 tokens drawn so that half the padded positions
  are padding;
- ``none``: every row 64 + 64 tokens (no padding: packing can only cost here).

Each rollout goes through the three layouts back to back, their order rotating from one rollout to
the next, and the rollouts ``--rounds`` times over (one warm-up pass first): a change of the
machine's load falls on the three alike, and each rollout and round gives one ratio per pair of
layouts from adjacent measurements. The generate phase, the same computation in every layout, is
timed once per rollout and round and shared. Prints per mix and layout the median CPU seconds
(``process_time``: steadier than wall time on a shared machine) per phase and per step, the ratios
padded ÷ packed and grouped ÷ packed (median and interquartile range over rollouts and rounds), the
padding share of each mix, and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYOUTS = ("padded", "grouped", "packed")
PHASES = ("generate", "score", "train")
MIXES = ("tldr", "long_tail", "half", "none")


class Engine(torch.nn.Module):
    """What the stage's functions use of a DeepSpeed engine, around a module and AdamW."""

    def __init__(self, module: torch.nn.Module, lr: float | None = None):
        super().__init__()
        self.module = module
        self.optimizer = torch.optim.AdamW(module.parameters(), lr=lr) if lr else None

    def forward(self, **kwargs):
        return self.module(**kwargs)

    @property
    def device(self):
        return next(self.module.parameters()).device

    def zero_optimization_stage(self) -> int:
        return 0

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def build_models(seed: int = 0):
    """tiny-base as actor and reference, a reward model on its backbone as critic and RM."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from marlhf.models.reward_model import RewardModel
    from marlhf.models.zoo import ensure_tiny_base

    path = ensure_tiny_base()
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(path)
    load = lambda: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # noqa: E731
    critic = RewardModel.from_pretrained(path, dtype=torch.float32, init_std=0.5)
    reward = RewardModel.from_pretrained(path, dtype=torch.float32, init_std=0.5).eval()
    models = SimpleNamespace(
        actor=Engine(load(), lr=1e-5),
        ref=Engine(load().eval()),
        critic=Engine(critic, lr=1e-5),
        reward=Engine(reward),
    )
    return models, tok


def _rollout(prompt_lens, answer_lens, vocab: int, eos: int, g: torch.Generator):
    """A rollout of random tokens: left-padded prompts and right-padded answers ending in EOS."""
    from marlhf.models.sequences import pack_flush_left
    from marlhf.stages.ppo.rollout import Rollout

    B, P, A = len(prompt_lens), max(prompt_lens), max(answer_lens)
    prompt = torch.randint(5, vocab, (B, P), generator=g)
    prompt_mask = torch.zeros(B, P, dtype=torch.long)
    response = torch.randint(5, vocab, (B, A), generator=g)
    mask = torch.zeros(B, A, dtype=torch.bool)
    for b, (p, a) in enumerate(zip(prompt_lens, answer_lens, strict=True)):
        prompt_mask[b, P - p :] = 1
        mask[b, :a] = True
        response[b, a - 1] = eos
    response = response.masked_fill(~mask, 0)
    seq, att, start = pack_flush_left(prompt, prompt_mask, response, mask, pad_id=0)
    ends = torch.ones(B, dtype=torch.bool)
    return (
        Rollout(seq, att, start, response, mask, ends, [str(b) for b in range(B)]),
        prompt,
        prompt_mask,
    )


def _lognormal(n: int, median: float, sigma: float, lo: int, hi: int, g) -> list[int]:
    x = torch.exp(math.log(median) + sigma * torch.randn(n, generator=g))
    return x.round().clamp(lo, hi).long().tolist()


def mix_rollouts(mix: str, rows: int, steps: int, models, tok, workdir: Path):
    """``steps`` rollouts (and their prompts) of ``rows`` rows of a length mix (module docstring)."""
    g = torch.Generator().manual_seed(1234)
    vocab, eos = len(tok), tok.eos_token_id
    out = []
    if mix == "tldr":
        from marlhf.data.collate import PromptCollator
        from marlhf.data.config import DataConfig
        from marlhf.data.tokenize import build_prompt_dataset
        from marlhf.models.decode import sample
        from marlhf.models.sequences import response_mask

        data = DataConfig(data_path=("synthetic-tldr",), data_output_path=str(workdir / "cache"))
        ds, _ = build_prompt_dataset(data, tok, "train", 1234, max_prompt_len=160)
        collate = PromptCollator(tok.pad_token_id)
        for s in range(steps):
            batch = collate([ds[(s * rows + i) % len(ds)] for i in range(rows)])
            ids = sample(models.actor.module, batch["input_ids"], batch["attention_mask"],
                         max_new_tokens=40, temperature=1.0, eos_ids=[eos],
                         pad_id=tok.pad_token_id, generator=g)  # fmt: skip
            mask, _ = response_mask(ids, [eos])
            answers = [max(1, int(n)) for n in mask.sum(1)]
            prompts = [int(n) for n in batch["attention_mask"].sum(1)]
            out.append(_rollout(prompts, answers, vocab, eos, g))
        return out
    for _ in range(steps):
        if mix == "long_tail":
            prompts = _lognormal(rows, 60, 0.8, 16, 400, g)
            answers = _lognormal(rows, 24, 1.2, 1, 256, g)
        elif mix == "half":
            # lengths 8 + a, a spread evenly over 1..248 (half of each padded row is padding)
            answers = torch.randperm(rows, generator=g).mul(247).div(max(rows - 1, 1)).add(1)
            answers = answers.round().long().tolist()
            prompts = [8] * rows
        elif mix == "none":
            prompts, answers = [64] * rows, [64] * rows
        else:
            raise ValueError(f"unknown mix {mix!r}")
        out.append(_rollout(prompts, answers, vocab, eos, g))
    return out


def _cfg(layout: str, rows: int):
    from marlhf.stages.ppo.config import PerfConfig, PPOConfig, PPOStageConfig

    perf = PerfConfig(length_groups=1 if layout == "padded" else 4)
    perf.batching.packing = layout == "packed"
    return PPOStageConfig(
        ppo=PPOConfig(per_device_training_batch_size=rows // 2, ppo_epochs=1, entropy_coef=0.0),
        perf=perf,
    )


def _experience(ro, scored):
    from marlhf.stages.ppo.experience import Experience

    B, A = ro.action_mask.shape
    g = torch.Generator().manual_seed(0)
    z = torch.zeros(B, A)
    seg = torch.where(ro.action_mask, torch.arange(A) // 5, -1)
    return Experience(
        ro, scored.old_logprobs, scored.ref_logprobs, scored.values, torch.zeros(B), z, z, seg, z,
        torch.zeros(B).bool(), advantages=torch.randn(B, A, generator=g) * ro.action_mask,
        returns=torch.randn(B, A, generator=g) * ro.action_mask,
    )  # fmt: skip


def generate_seconds(models, tok, prompt, prompt_mask, tokens: int) -> float:
    """CPU seconds of decoding ``tokens`` tokens for every prompt (the layouts share it)."""
    from marlhf.models.decode import sample

    c0 = time.process_time()
    sample(models.actor.module, prompt, prompt_mask, max_new_tokens=tokens, temperature=1.0,
           eos_ids=[-1], pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0))  # fmt: skip
    return time.process_time() - c0


def forward_backward_seconds(models, ro, layout: str) -> dict:
    """CPU seconds of the score and train phases of one PPO step in ``layout``."""
    from marlhf.stages.ppo.scoring import score
    from marlhf.stages.ppo.update import ppo_update

    cfg = _cfg(layout, ro.sequences.shape[0])
    c0 = time.process_time()
    scored = score(models, ro, cfg.trainer, need_entropy=False)
    c1 = time.process_time()
    exp = _experience(ro, scored)
    ppo_update(models, exp, cfg.trainer, True, torch.Generator().manual_seed(0))
    return {"score": c1 - c0, "train": time.process_time() - c1}


def padding_share(rollouts) -> float:
    """Padding's share of the padded positions (B × T) over the mix's rollouts."""
    real = sum(int(r[0].attention_mask.sum()) for r in rollouts)
    area = sum(r[0].sequences.numel() for r in rollouts)
    return 1 - real / area


def _quartiles(xs: list[float]) -> dict:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "q1": q[0], "q3": q[2]}


def _total(t: dict, key: str) -> float:
    if key == "score+train":
        return t["score"] + t["train"]
    return sum(t.values()) if key == "step" else t[key]


def run_mix(mix: str, args, models, tok, workdir: Path) -> dict:
    """Each rollout of the mix through the three layouts back to back (their order rotating), the
    rollouts ``--rounds`` times over; a ratio per rollout and round from the three adjacent
    measurements, so the machine's load falls on the layouts alike."""
    rollouts = mix_rollouts(mix, args.rows, args.steps + 1, models, tok, workdir)
    for ro, _, _ in rollouts[:1]:  # warm-up
        for lay in LAYOUTS:
            forward_backward_seconds(models, ro, lay)
    times: dict[str, list[dict]] = {lay: [] for lay in LAYOUTS}
    n = 0
    for _ in range(args.rounds):
        for ro, prompt, pmask in rollouts[1:]:
            # the generate phase: the same computation in every layout, timed once and shared
            gen = generate_seconds(models, tok, prompt, pmask, ro.response_ids.shape[1])
            order = LAYOUTS[n % 3 :] + LAYOUTS[: n % 3]
            n += 1
            for lay in order:
                times[lay].append({"generate": gen, **forward_backward_seconds(models, ro, lay)})
    summary = {"padding_share": padding_share(rollouts), "layouts": {}, "ratios": {}}
    keys = (*PHASES, "score+train", "step")
    for lay in LAYOUTS:
        summary["layouts"][lay] = {
            k: statistics.median(_total(t, k) for t in times[lay]) for k in keys
        }
    for base in ("padded", "grouped"):
        summary["ratios"][f"{base}/packed"] = {
            k: _quartiles(
                [
                    _total(a, k) / _total(b, k)
                    for a, b in zip(times[base], times["packed"], strict=True)
                ]
            )
            for k in keys[1:]
        }
    return summary


def print_mix(mix: str, s: dict) -> None:
    print(f"\n== {mix}: padding {100 * s['padding_share']:.0f} % of the padded positions")
    head = "".join(f"{k:>12}" for k in (*PHASES, "score+train", "step"))
    print(f"{'CPU s/step':<22}{head}")
    for lay, med in s["layouts"].items():
        print(f"{lay:<22}" + "".join(f"{med[k]:>12.3f}" for k in (*PHASES, "score+train", "step")))
    for name, ratios in s["ratios"].items():
        cells = "".join(
            f"{ratios[k]['median']:>6.2f}x {ratios[k]['q1']:.2f}-{ratios[k]['q3']:.2f}"
            for k in ("score", "train", "score+train", "step")
        )
        print(f"{name:<22}{'':>12}{cells}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mixes", nargs="+", default=list(MIXES), choices=MIXES)
    ap.add_argument("--rows", type=int, default=16, help="rows per step (minibatch: half)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per layout and round")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench_packing_"))
    t0 = time.perf_counter()
    load = " ".join(f"{x:.2f}" for x in __import__("os").getloadavg())
    models, tok = build_models()
    results = {}
    for mix in args.mixes:
        results[mix] = run_mix(mix, args, models, tok, workdir)
        print_mix(mix, results[mix])
    load_after = " ".join(f"{x:.2f}" for x in __import__("os").getloadavg())
    wall = time.perf_counter() - t0
    print(f"\nload average before {load}, after {load_after}; {wall:.0f} s")
    out = {"results": results, "args": {k: str(v) for k, v in vars(args).items()}, "wall_s": wall}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
