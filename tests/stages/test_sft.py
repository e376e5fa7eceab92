"""End-to-end tests of stage 1 (``marlhf.stages.sft``): the real program under real DeepSpeed on CPU.

Each run is a subprocess (``python -m marlhf.stages.sft``, ``torchrun`` or the ``deepspeed`` launcher)
on the tiny model and the bundled data. References are independent of the stage: a loop over response
tokens for the loss, perplexities recomputed in this process from the saved weights, an uninterrupted
run for resume, a one-process run for two processes.

Subprocesses keep this process's PATH: DeepSpeed JIT-builds its CPU shared-memory op with whichever
``ninja`` is first on PATH, and two ninja versions hash the build commands differently, so mixing them
rebuilds the op (about a minute) in the shared extension cache.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from marlhf.runtime.distributed import free_port
from tests.support.forked import run_python
from tests.support.stage_env import stage_env

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300
# Flags every run shares; the runs differ only in what the test is about.
COMMON = (
    "--model_name_or_path", "tiny",
    "--max_seq_len", "192",
    "--learning_rate", "2e-3",
    "--seed", "1234",
    "--disable_progress_bar",
)  # fmt: skip


# --- helpers -----------------------------------------------------------------------------------
class Env:
    """Where the module's runs share the tiny model (MARLHF_HOME) and the tokenised-data cache."""

    def __init__(self, root: Path):
        self.root = root
        self.home = root / "home"
        self.cache = root / "data_cache"

    def environ(self) -> dict[str, str]:
        return stage_env(self.home) | {"MKL_NUM_THREADS": "1"}

    def command(self, out: Path, *flags: str, launcher: str = "python") -> list[str]:
        args = [*COMMON, "--data_output_path", str(self.cache), "--output_dir", str(out), *flags]
        if launcher == "python":
            return [sys.executable, "-m", "marlhf.stages.sft", *args]
        if launcher == "torchrun":
            return [
                sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", str(free_port()), "-m", "marlhf.stages.sft", *args,
            ]  # fmt: skip
        if launcher == "deepspeed":
            return [
                sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2",
                "--master_port", str(free_port()), "--module", "marlhf.stages.sft", *args,
            ]  # fmt: skip
        raise ValueError(launcher)

    def run(self, out: Path, *flags: str, launcher: str = "python", check: bool = True):
        proc = run_python(
            self.command(out, *flags, launcher=launcher),
            cwd=REPO,
            env=self.environ(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        if check and proc.returncode != 0:
            pytest.fail(f"SFT run failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}")
        return proc


def metrics(out: Path) -> list[dict]:
    from marlhf.runtime.tracking import read_metrics

    return read_metrics(out / "metrics.jsonl")


def train_losses(out: Path) -> dict[int, float]:
    """``step -> train/loss``."""
    return {r["step"]: r["train/loss"] for r in metrics(out) if "train/loss" in r}


def all_train_losses(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["train/loss"]) for r in metrics(out) if "train/loss" in r]


def last_eval(out: Path) -> dict:
    return [r for r in metrics(out) if "eval/ppl" in r][-1]


def weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def data_cfg(env: Env, **kw):
    from marlhf.data.config import DataConfig

    return DataConfig(data_output_path=str(env.cache), max_seq_len=192, **kw)


def tokenizer(tiny_dir: str):
    from marlhf.config import ModelConfig
    from marlhf.models.load import load_tokenizer

    return load_tokenizer(ModelConfig(model_name_or_path=tiny_dir), padding_side="right")


@torch.no_grad()
def eval_ppl(model_dir: str, env: Env, tiny_dir: str, **data_kw) -> float:
    """Perplexity of the whole phase-1 eval split under the weights in ``model_dir``, computed here
    with a plain per-row loop over response tokens (not the stage's evaluate)."""
    from transformers import AutoModelForCausalLM

    from marlhf.data.tokenize import build_sft_dataset

    tok = tokenizer(tiny_dir)
    ds = build_sft_dataset(data_cfg(env, **data_kw), tok, "eval", seed=1234)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    nll, count = 0.0, 0
    for row in ds:
        ids = torch.tensor([row["input_ids"]])
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
        for t, label in enumerate(row["labels"]):
            if t > 0 and label != -100:
                nll -= float(logp[t - 1, label])
                count += 1
    return math.exp(nll / count)


# --- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Env:
    return Env(tmp_path_factory.mktemp("sft_stage"))


@pytest.fixture(scope="module")
def tiny_dir(env) -> str:
    """Build the tiny model once into the module's MARLHF_HOME (the runs find it there)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MARLHF_HOME", str(env.home))
        from marlhf.models.zoo import ensure_tiny

        return ensure_tiny()


BASE_FLAGS = ("--per_device_train_batch_size", "4", "--max_steps", "6", "--save_steps", "3")


@pytest.fixture(scope="module")
def base6(env, tiny_dir) -> Path:
    """The reference run: one process, ZeRO-0, global batch 4, 6 steps, checkpoints every 3."""
    out = env.root / "base6"
    env.run(out, *BASE_FLAGS, "--zero_stage", "0")
    return out


@pytest.fixture(scope="module")
def base_ppl(env, tiny_dir) -> float:
    return eval_ppl(tiny_dir, env, tiny_dir)


# --- what the loss sees ------------------------------------------------------------------------
def test_hand_built_example_labels_mask_the_prompt(env, tiny_dir, tmp_path):
    """A local jsonl row -> ``[bos] + prompt + response + [eos]`` with labels only on the response."""
    from marlhf.data.collate import SFTCollator
    from marlhf.data.tokenize import build_sft_dataset

    tok = tokenizer(tiny_dir)
    rows = [
        {"prompt": "POST: my cat broke a promise.\nTL;DR: ", "chosen": "the cat broke it"},
        {"prompt": "POST: I moved to a new city.\nTL;DR: ", "chosen": "I moved"},
    ]
    path = tmp_path / "hand.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = data_cfg(env, data_path=(str(path),), data_split="1,0,0")
    ds = build_sft_dataset(cfg, tok, "train", seed=1234)
    batch = SFTCollator(tok.pad_token_id)([ds[i] for i in range(len(ds))])

    bos, eos = tok.convert_tokens_to_ids("<bos>"), tok.convert_tokens_to_ids("<eos>")
    expected = set()
    for r in rows:
        p = tok.encode(r["prompt"], add_special_tokens=False)
        c = tok.encode(r["chosen"], add_special_tokens=False)
        ids = [bos, *p, *c, eos]
        expected.add((tuple(ids), tuple([-100] * (1 + len(p)) + [*c, eos])))
    got = set()
    for ids, mask, labels in zip(
        batch["input_ids"], batch["attention_mask"], batch["labels"], strict=True
    ):
        n = int(mask.sum())
        assert bool((labels[n:] == -100).all()), "padding must carry no label"
        assert bool((ids[n:] == tok.pad_token_id).all())
        got.add((tuple(ids[:n].tolist()), tuple(labels[:n].tolist())))
    assert got == expected


def test_real_batch_loss_is_over_response_tokens_only(env, tiny_dir):
    """The first micro-batch the stage trains on (bundled data): ``lm_loss_sum`` with its labels
    equals a loop over response tokens, and the prompt gets no gradient."""
    from marlhf.data.collate import SFTCollator
    from marlhf.data.sources import load_examples
    from marlhf.data.split import phase_indices
    from marlhf.data.tokenize import build_sft_dataset
    from marlhf.models.lm_loss import lm_loss_sum
    from marlhf.runtime.batching import epoch_permutation, step_micro_batches

    tok = tokenizer(tiny_dir)
    ds = build_sft_dataset(data_cfg(env), tok, "train", seed=1234)
    (idx,) = step_micro_batches(epoch_permutation(len(ds), 1234, 0), 0, 4, 1, 1, 0)
    batch = SFTCollator(tok.pad_token_id)([ds[i] for i in idx])

    # where each response starts, from the raw examples (phase 1 of the train split, file order)
    exs, _ = load_examples("synthetic-tldr", "train")
    exs = [exs[i] for i in phase_indices(len(exs), "2,4,4", 1, seed=1234)]
    exs = [e for e in exs if e.chosen is not None]
    assert len(exs) == len(ds)
    starts, ends = [], []
    for i in idx:
        p = tok.encode(exs[i].prompt, add_special_tokens=False)
        c = tok.encode(exs[i].chosen, add_special_tokens=False)
        assert 1 + len(p) + len(c) + 1 <= 192, "pick a batch that needs no truncation"
        starts.append(1 + len(p))
        ends.append(1 + len(p) + len(c) + 1)
        assert ds[i]["input_ids"] == [tok.bos_token_id, *p, *c, tok.eos_token_id]

    B, T = batch["input_ids"].shape
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, T, len(tok), generator=g, dtype=torch.float64, requires_grad=True)
    nll, count = lm_loss_sum(logits, batch["labels"])

    ref, n_ref = 0.0, 0
    for b in range(B):
        for t in range(starts[b], ends[b]):  # token t is predicted at position t - 1
            target = int(batch["input_ids"][b, t])
            ref -= float(torch.log_softmax(logits[b, t - 1].detach(), -1)[target])
            n_ref += 1
    assert int(count) == n_ref
    assert float(nll.detach()) == pytest.approx(ref, rel=1e-6)

    nll.backward()
    for b in range(B):
        assert float(logits.grad[b, : starts[b] - 1].abs().max()) == 0.0  # predicting the prompt
        assert float(logits.grad[b, ends[b] - 1 :].abs().max()) == 0.0  # after eos, padding
        assert float(logits.grad[b, starts[b] - 1 : ends[b] - 1].abs().min()) > 0.0


# --- training ----------------------------------------------------------------------------------
def test_output_layout(base6):
    out = base6
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).is_file(), name
    for name in ("run_config.json", "ds_config.json"):
        assert (out / name).is_file(), name
        assert (out / "checkpoints" / "step-3" / name).is_file(), name
    assert (out / "checkpoints" / "step-3" / "model.safetensors").is_file()
    # the final model is the run directory itself: no checkpoints/step-6
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-3"]
    assert json.loads((out / "train_state" / "latest.json").read_text())["tag"] == "step-6"
    assert (out / "train_state" / "model" / "step-3").is_dir()
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    run_config = json.loads((out / "run_config.json").read_text())
    assert json.dumps(run_config).count('"max_steps": 6') == 1
    ds_config = json.loads((out / "ds_config.json").read_text())
    assert ds_config["train_batch_size"] == 4
    assert ds_config["zero_optimization"]["stage"] == 0
    assert [s for s, _ in all_train_losses(out)] == [1, 2, 3, 4, 5, 6]

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(out / "checkpoints" / "step-3"))
    assert model.config.model_type == "gemma"
    assert AutoTokenizer.from_pretrained(str(out)).pad_token == "<pad>"


def test_logged_lr_is_the_lr_that_made_the_step(base6):
    """Cosine over 6 steps, no warm-up: step s (1-based) is taken with 2e-3 * (1 + cos(pi (s-1)/6)) / 2,
    so the first row shows the peak and the last a positive rate (the schedule's next value, 0 at
    the end, is not what step 6 used)."""
    lrs = {r["step"]: r["lr"] for r in metrics(base6) if "lr" in r}
    for s in range(1, 7):
        want = 2e-3 * 0.5 * (1 + math.cos(math.pi * (s - 1) / 6))
        assert lrs[s] == pytest.approx(want, rel=1e-9, abs=1e-12), (s, lrs[s], want)


@pytest.fixture(scope="module")
def zero_runs(env, base6) -> dict[int, Path]:
    runs = {0: base6}
    for stage in (2, 3):
        runs[stage] = env.root / f"zero{stage}"
        env.run(runs[stage], *BASE_FLAGS, "--zero_stage", str(stage))
    return runs


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_loss_falls_under_zero(stage, zero_runs, env, tiny_dir, base_ppl):
    out = zero_runs[stage]
    losses = train_losses(out)
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert losses[6] < losses[1] - 0.5, losses
    ppl = last_eval(out)["eval/ppl"]
    assert ppl < 0.7 * base_ppl, (ppl, base_ppl)
    # the saved directory is a plain HF checkpoint of the architecture (nothing missing or extra,
    # e.g. no non-persistent buffers gathered under ZeRO-3)
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert not any(info.values()), info
    # the logged eval is the saved model's: recompute it from model.safetensors, here
    assert eval_ppl(str(out), env, tiny_dir) == pytest.approx(ppl, rel=1e-4)
    # ZeRO partitions state, not the math: the same losses as ZeRO-0
    ref = train_losses(zero_runs[0])
    for step in ref:
        assert losses[step] == pytest.approx(ref[step], rel=1e-5, abs=1e-5)


def test_resume_from_copied_run_matches_uninterrupted(env, base6):
    copy = env.root / "resume_copy"
    shutil.copytree(base6, copy)
    latest = copy / "train_state" / "latest.json"
    state = json.loads(latest.read_text())
    latest.write_text(json.dumps({**state, "tag": "step-3", "step": 3}))
    kept = [r for r in metrics(copy) if r["step"] <= 3]  # metrics.jsonl still holds steps 4..6

    env.run(copy, *BASE_FLAGS, "--zero_stage", "0")
    assert metrics(copy)[: len(kept)] == kept  # the rows up to the checkpoint, untouched
    got, ref = all_train_losses(copy), all_train_losses(base6)
    assert [s for s, _ in got] == [1, 2, 3, 4, 5, 6]
    for (step, loss), (_, loss_ref) in zip(got, ref, strict=True):
        assert abs(loss - loss_ref) <= 1e-6, (step, loss, loss_ref)
    lrs = [(r["step"], r["lr"]) for r in metrics(copy) if "lr" in r]
    assert lrs == [(r["step"], r["lr"]) for r in metrics(base6) if "lr" in r]
    a, b = weights(copy), weights(base6)
    for k in b:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)


def test_sigkill_and_resume_matches_uninterrupted(env, tiny_dir):
    """Kill the process as soon as the first resumable checkpoint is on disk, rerun the same
    command: every step is logged once (the killed process's rows after its checkpoint are
    dropped) and equals a run never killed."""
    flags = ("--per_device_train_batch_size", "2", "--max_steps", "24", "--save_steps", "3")
    ref = env.root / "kill_ref"
    env.run(ref, *flags)

    out = env.root / "killed"
    proc = subprocess.Popen(
        env.command(out, *flags),
        cwd=REPO,
        env=env.environ(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    latest = out / "train_state" / "latest.json"
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not latest.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"finished before the kill:\n{err[-3000:]}"
    killed_at = json.loads(latest.read_text())["step"]
    assert 3 <= killed_at < 24

    env.run(out, *flags)
    ref_losses = train_losses(ref)
    got = all_train_losses(out)
    assert [s for s, _ in got] == list(range(1, 25))
    for step, loss in got:
        assert abs(loss - ref_losses[step]) <= 1e-6, (step, loss, ref_losses[step])
    a, b = weights(out), weights(ref)
    for k in b:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_two_processes_match_one(launcher, env, base6):
    """Two ranks with micro-batch 2 = one process with micro-batch 4: the loss is normalised by the
    global token count, so per-step losses agree up to float reduction order."""
    out = env.root / f"two_{launcher}"
    flags = ("--per_device_train_batch_size", "2", "--max_steps", "6", "--save_steps", "3")
    env.run(out, *flags, "--zero_stage", "0", launcher=launcher)
    assert json.loads((out / "ds_config.json").read_text())["train_batch_size"] == 4
    got, ref = train_losses(out), train_losses(base6)
    assert sorted(got) == sorted(ref)
    for step in ref:
        assert got[step] == pytest.approx(ref[step], rel=1e-5, abs=1e-5), step
    tokens = {r["step"]: r["train/tokens"] for r in metrics(out) if "train/tokens" in r}
    tokens_ref = {r["step"]: r["train/tokens"] for r in metrics(base6) if "train/tokens" in r}
    assert tokens == tokens_ref
    # the eval split is sharded over ranks and summed: the same perplexity
    assert last_eval(out)["eval/loss"] == pytest.approx(last_eval(base6)["eval/loss"], rel=1e-5)
    a, b = weights(out), weights(base6)
    for k in b:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-4, msg=k)


@pytest.mark.parametrize(("n_eval", "eval_batch"), [(1, 2), (3, 1)])
def test_zero3_two_processes_with_uneven_eval_shards(n_eval, eval_batch, env, tiny_dir, tmp_path):
    """ZeRO-3 on two ranks whose eval shards have different batch counts: rank 1 runs padding
    forwards, since every forward gathers the partitioned parameters collectively (with one eval
    row and no padding, rank 0's gathers wait for a partner until the timeout). The logged eval is
    the perplexity of the eval rows, each counted once, under the saved model, recomputed here."""
    from marlhf.runtime.batching import eval_shard

    data = tmp_path / "data"
    data.mkdir()
    rows = [
        {"prompt": f"POST: my cat number {i} ran off again.\nTL;DR: ", "chosen": f"cat {i} ran off"}
        for i in range(8 + n_eval)
    ]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:8]))
    (data / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[8:]))
    counts = [len(eval_shard(n_eval, eval_batch, 2, r)) for r in (0, 1)]
    assert counts[0] == counts[1] + 1, counts
    out = env.root / f"zero3_uneven_eval{n_eval}"
    flags = (
        "--data_path", str(data), "--data_split", "1,0,0", "--per_device_train_batch_size", "2",
        "--per_device_eval_batch_size", str(eval_batch), "--max_steps", "1", "--zero_stage", "3",
        "--dist_timeout_s", "60",
    )  # fmt: skip
    proc = env.run(out, *flags, launcher="torchrun")
    assert f"8 train / {n_eval} eval examples" in proc.stderr
    want = eval_ppl(str(out), env, tiny_dir, data_path=(str(data),), data_split="1,0,0")
    assert last_eval(out)["eval/ppl"] == pytest.approx(want, rel=1e-4)


LORA_FLAGS = (
    "--per_device_train_batch_size",
    "4",
    "--max_samples",
    "60",
    "--num_train_epochs",
    "2",
    "--lora_dim",
    "4",
    "--learning_rate",
    "1e-2",
)  # fmt: skip (--lora_dim alone, as the README's example: the base is frozen)


@pytest.fixture(scope="module")
def lora_run(env, tiny_dir):
    """LoRA on a 60-row cap of the data: 12 SFT examples, 3 steps per epoch, 2 epochs."""
    out = env.root / "lora"
    return out, env.run(out, *LORA_FLAGS)


def test_two_epochs_see_every_example_once_each(lora_run, env, tiny_dir):
    from marlhf.data.tokenize import build_sft_dataset

    out, proc = lora_run
    assert "12 train / 12 eval examples, 3 steps/epoch, 6 steps" in proc.stderr
    rows = [r for r in metrics(out) if "train/loss" in r]
    assert [r["train/epoch"] for r in rows] == pytest.approx([1 / 3, 2 / 3, 1, 4 / 3, 5 / 3, 2])
    assert [r["step"] for r in metrics(out) if "eval/ppl" in r] == [3, 6]  # at each epoch's end
    # every example exactly once per epoch: the supervised tokens of an epoch are the dataset's
    ds = build_sft_dataset(data_cfg(env, max_samples=60), tokenizer(tiny_dir), "train", seed=1234)
    total = sum(sum(label != -100 for label in labels) for labels in ds["labels"])
    tokens = [r["train/tokens"] for r in rows]
    assert sum(tokens[:3]) == total and sum(tokens[3:]) == total


def test_run_config_given_back_as_config_reproduces_the_run(env, tiny_dir):
    """--config <run>/run_config.json (and a new --output_dir) trains the same run again."""
    first, again = env.root / "config_first", env.root / "config_again"
    env.run(
        first, "--max_steps", "2", "--learning_rate", "3e-3", "--per_device_train_batch_size", "3"
    )
    cmd = [sys.executable, "-m", "marlhf.stages.sft", "--config", str(first / "run_config.json"),
           "--output_dir", str(again)]  # fmt: skip
    proc = run_python(cmd, cwd=REPO, env=env.environ(), capture_output=True, text=True,
                          timeout=TIMEOUT_S)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    cfg_a = json.loads((first / "run_config.json").read_text())
    cfg_b = json.loads((again / "run_config.json").read_text())
    cfg_a["log"].pop("output_dir"), cfg_b["log"].pop("output_dir")
    assert cfg_a == cfg_b
    strip = [
        {k: v for k, v in r.items() if k not in ("time", "train/step_time_s")}
        for r in metrics(first)
    ]
    assert strip == [
        {k: v for k, v in r.items() if k not in ("time", "train/step_time_s")}
        for r in metrics(again)
    ]


def test_lora_console_one_line_per_step_counts_and_adapter(lora_run, tiny_dir):
    """Without bars, one line per step; the parameter counts logged (the LoRA weights alone
    train); the adapter saved too, and over the base it gives the saved model's logits."""
    import re

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out, proc = lora_run
    steps = re.findall(r"sft step (\d+)/6: loss=", proc.stderr)
    assert steps == [str(s) for s in range(1, 7)], proc.stderr[-3000:]
    assert "Loading weights" not in proc.stderr and "it/s]" not in proc.stderr  # no library bars
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    lora = sum(
        4 * (m.in_features + m.out_features)
        for n, m in base.named_modules()
        if isinstance(m, torch.nn.Linear) and "layers." in n and not n.endswith("lm_head")
    )  # fmt: skip
    total = sum(p.numel() for p in base.parameters()) + lora
    line = rf"model with LoRA r=4 on \d+ modules: trainable {lora:,} / total {total:,} param"
    assert re.search(line, proc.stderr), proc.stderr[-3000:]
    adapted = PeftModel.from_pretrained(base, out / "adapter").eval()
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(
        4, base.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        want = merged(input_ids=ids).logits
        torch.testing.assert_close(adapted(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)
    # where the start-up went, once, after the first step
    lines = re.findall(r"start-up [\d.]+ s wall, [\d.]+ s CPU: (.*) \(wall/CPU s\)", proc.stderr)
    assert len(lines) == 1
    phases = [p.rpartition(" ")[0] for p in lines[0].split(", ")]
    assert phases == ["imports", "distributed", "data", "model", "engine", "first step"]
    assert (out / "adapter" / "adapter_config.json").exists()
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["r"] == 4


def test_lora_only_trains_and_saves_a_merged_plain_model(lora_run, tiny_dir):
    from transformers import AutoModelForCausalLM

    from marlhf.config import ModelConfig
    from marlhf.models.lora import apply_lora

    out, _ = lora_run
    losses = train_losses(out)
    assert losses[6] < losses[1], losses

    merged, info = AutoModelForCausalLM.from_pretrained(
        str(out), dtype=torch.float32, output_loading_info=True
    )
    assert not any(info.values()), info  # no missing / unexpected (lora_*) keys
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    m_sd, b_sd = merged.state_dict(), base.state_dict()
    assert set(m_sd) == set(b_sd)
    changed = [k for k in b_sd if not torch.equal(m_sd[k], b_sd[k])]
    assert changed and all(".layers." in k and k.endswith("proj.weight") for k in changed), changed
    assert torch.equal(m_sd["model.embed_tokens.weight"], b_sd["model.embed_tokens.weight"])

    # the trained peft model, rebuilt from DeepSpeed's checkpoint of the module
    cfg = ModelConfig(model_name_or_path=tiny_dir, lora_dim=4, only_optimize_lora=True)
    peft_model = apply_lora(
        AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32), cfg
    )
    ckpt = out / "train_state" / "model" / "step-6" / "mp_rank_00_model_states.pt"
    peft_model.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=False)["module"])
    vocab = base.config.vocab_size
    ids = torch.randint(4, vocab, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = peft_model.eval()(input_ids=ids).logits
        got = merged.eval()(input_ids=ids).logits
        plain = base.eval()(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert float((want - plain).abs().max()) > 1e-3


def test_missing_field_names_file_line_and_field(env, tiny_dir, tmp_path):
    data = tmp_path / "bad"
    data.mkdir()
    good = {"prompt": "Q: hello\nA:", "chosen": " hi"}
    lines = [good, good, {"prompt": "Q: x\nA:"}]  # line 3 has no "chosen"
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (data / "eval.jsonl").write_text(json.dumps(good) + "\n")
    proc = env.run(
        tmp_path / "out", "--data_path", str(data), "--data_split", "1,0,0", "--max_steps", "1",
        check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    want = f'{data / "train.jsonl"} line 3: field "chosen" missing'
    assert want in proc.stderr, proc.stderr[-3000:]


def test_max_steps_loops_over_the_data_epoch_after_epoch(env, tiny_dir, tmp_path):
    """``--max_steps 10`` over 4 steps per epoch with ``--num_train_epochs 1``: 10 steps are
    trained (``--max_steps`` wins, as in HF Trainer), the data looped over: every epoch sees every
    example once, and the last epoch is cut at step 10. The file's columns are
    ``query`` and ``answer``, read through ``--data_columns``."""
    data = tmp_path / "qa"
    data.mkdir()
    rows = [{"query": f"Q: what is {i} plus {i}?\nA:", "answer": f" {2 * i}"} for i in range(36)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:32]))
    (data / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[32:]))
    out = tmp_path / "out"
    proc = env.run(
        out, "--data_path", str(data), "--data_split", "1,0,0", "--data_columns",
        "prompt=query,chosen=answer", "--per_device_train_batch_size", "8", "--max_steps", "10",
        "--num_train_epochs", "1",
    )  # fmt: skip
    assert "32 train / 4 eval examples, 4 steps/epoch, 10 steps" in proc.stderr
    rows = [r for r in metrics(out) if "train/loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 11))
    assert [r["train/epoch"] for r in rows] == pytest.approx([(s + 1) / 4 for s in range(10)])
    assert [r["step"] for r in metrics(out) if "eval/ppl" in r] == [4, 8, 10]
    tokens = [r["train/tokens"] for r in rows]
    assert sum(tokens[0:4]) == sum(tokens[4:8])  # each epoch: every example once
