"""MA-PPO end to end on CPU through real DeepSpeed: every termination rule, checkpoints, resume."""

import json
import math
import shutil
import sys
from pathlib import Path

import pytest

from marlhf.runtime.tracking import read_metrics
from tests.support.forked import run_python
from tests.support.pickles import pickled_modules
from tests.support.stage_env import stage_env as _env

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny policy (untrained is enough to exercise the machinery) and a reward model on it."""
    import torch

    from marlhf.models.reward_model import RewardModel, save_reward_model
    from marlhf.models.zoo import build_tiny

    base = tmp_path_factory.mktemp("ppo")
    actor = build_tiny(base / "actor")
    torch.manual_seed(0)
    from transformers import AutoTokenizer

    rm = RewardModel.from_pretrained(actor)
    save_reward_model(
        rm, AutoTokenizer.from_pretrained(actor), base / "rm", score_stats={"mean": 0.0, "std": 1.0}
    )
    return base, actor, base / "rm"


def _ppo(base, actor, rm, out, *extra, steps=2, stderr: list | None = None):
    cmd = [
        sys.executable,
        "-m",
        "marlhf.stages.ppo",
        "--actor_model_name_or_path",
        str(actor),
        "--critic_model_name_or_path",
        str(rm),
        "--data_output_path",
        str(base / "cache"),
        "--max_prompt_seq_len",
        "160",
        "--max_answer_seq_len",
        "12",
        "--per_device_generation_batch_size",
        "4",
        "--per_device_training_batch_size",
        "2",
        "--max_steps",
        str(steps),
        "--output_dir",
        str(out),
        "--disable_progress_bar",
        *extra,
    ]
    proc = run_python(cmd, env=_env(base), capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    if stderr is not None:
        stderr.append(proc.stderr)
    return read_metrics(out / "metrics.jsonl")


@pytest.mark.parametrize(
    "rule",
    [
        ["--termination_condition", "fixed", "--ngram", "3"],
        [
            "--termination_condition",
            "randomized",
            "--repeat_times",
            "2",
            "--ratio_level",
            "macro",
            "--actor_zero_stage",
            "3",
            "--critic_zero_stage",
            "3",
            "--generation_backend",  # HF generate (the default is now the static decoder)
            "hf",
        ],
        [
            "--termination_condition",
            "ppl",
            "--value_function",
            "position",
            "--generation_backend",
            "static",
        ],
        [
            "--termination_condition",
            "entropy",
            "--target_macro_len",
            "3",
            "--value_function",
            "unit",
            "--enable_tensorboard",
        ],
        [
            "--termination_condition",
            "parsing",
            "--parser_backend",
            "python",
            "--parsing_cutoff",
            "4",
        ],
    ],
    ids=lambda r: r[1],
)
def test_every_termination_rule_trains(models, tmp_path, rule):
    base, actor, rm = models
    rows = _ppo(base, actor, rm, tmp_path / "run", *rule)
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "objective/score",
        "objective/kl",
        "loss/policy",
        "loss/value",
        "policy/clipfrac",
        "policy/approx_kl",
        "policy/entropy",
        "value/explained_variance",
        "macro/count",
        "macro/mean_len",
        "macro/fallbacks",
        "time/generate",
        "time/score",
        "time/macro",
        "time/train",
    ):
        assert key in rows[-1], key
    assert rows[-1]["macro/mean_len"] >= 1.0
    if rule[1] == "entropy":  # the threshold --target_macro_len picked, in both logs
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        taus = [r["macro/entropy_threshold"] for r in rows]
        events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
        events.Reload()
        logged = [e.value for e in events.Scalars("macro/entropy_threshold")]
        # metrics.jsonl is strict JSON: a threshold of +-inf is null there
        assert [None if abs(v) == float("inf") else v for v in logged] == [
            None if t is None else pytest.approx(t) for t in taus
        ]
    # the actor loads as a plain HF model, the critic as a reward model
    from transformers import AutoModelForCausalLM

    from marlhf.models.reward_model import load_reward_model

    AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "actor")
    load_reward_model(tmp_path / "run" / "critic")
    assert (
        json.loads((tmp_path / "run" / "actor" / "run_config.json").read_text())["macro"][
            "termination_condition"
        ]
        == rule[1]
    )


def test_resume_continues_with_identical_metrics(models, tmp_path):
    base, actor, rm = models
    full = tmp_path / "full"
    # `randomized`: its draws after the resume must be the ones of the uninterrupted run
    rule = ("--termination_condition", "randomized", "--ngram_choices", "1,2,3")
    rows = _ppo(base, actor, rm, full, "--save_steps", "2", *rule, steps=4)
    assert (full / "checkpoints" / "step-2" / "actor" / "config.json").exists()
    # simulate a kill right after the step-2 checkpoint
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    (cut / "train_state" / "latest.json").write_text(json.dumps({"tag": "step-2", "step": 2}))
    kept = [json.dumps(r) for r in rows if r["step"] <= 2]
    (cut / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    resumed = _ppo(base, actor, rm, cut, "--save_steps", "2", *rule, steps=4)
    a = {r["step"]: r for r in rows}
    b = {r["step"]: r for r in resumed}
    assert sorted(b) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in (
            "objective/score",
            "objective/kl",
            "loss/policy",
            "loss/value",
            "response/length",
            "macro/count",
            "macro/mean_len",
        ):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-5, abs=1e-6), (step, key)


def test_lora_ema_and_pretraining_mix(models, tmp_path):
    """LoRA on actor and critic (their bases frozen), the EMA and the LM-loss mix train; the actor
    and the critic are saved merged, each with its adapter, which over its base gives the saved
    model's outputs; the critic's parameter line counts its value head."""
    import re

    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModel

    base, actor, rm = models
    stderr: list[str] = []
    rows = _ppo(
        base,
        actor,
        rm,
        tmp_path / "run",
        "--actor_lora_dim",
        "4",
        "--critic_lora_dim",
        "4",
        "--enable_ema",
        "--unsup_coef",
        "0.1",
        "--critic_warmup_steps",
        "1",
        "--target_kl",
        "0.1",
        stderr=stderr,
    )
    assert (
        "loss/unsup" in rows[-1] and "loss/policy" not in rows[0]
    )  # step 1 trains only the critic
    assert (
        rows[-1]["objective/kl_coef"] != rows[0]["objective/kl_coef"]
        or rows[0]["objective/kl"] == 0.1
    )
    from transformers import AutoModelForCausalLM

    from marlhf.models.reward_model import load_reward_model

    for d in ("actor", "actor_ema"):
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / d)
        assert not any("lora" in k for k in model.state_dict())
    critic, _ = load_reward_model(tmp_path / "run" / "critic")
    assert re.search(
        r"critic \(value head included\) with LoRA r=4 on \d+ modules: trainable", stderr[0]
    )

    ids = torch.randint(
        4, critic.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0)
    )
    mask = torch.ones_like(ids)
    run = tmp_path / "run"
    with torch.no_grad():
        adapted = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(actor), run / "actor" / "adapter"
        ).eval()
        merged = AutoModelForCausalLM.from_pretrained(run / "actor").eval()
        want = merged(input_ids=ids).logits
        torch.testing.assert_close(adapted(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)
        backbone = PeftModel.from_pretrained(
            AutoModel.from_pretrained(rm), run / "critic" / "adapter"
        ).eval()
        head = load_file(str(run / "critic" / "value_head.safetensors"))["weight"]
        hidden = backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        want = critic.eval()(ids, mask)
        torch.testing.assert_close((hidden @ head.T).squeeze(-1), want, rtol=1e-4, atol=1e-4)


def test_dense_segment_rewards_with_the_segment_rms_own_rule(models, tmp_path):
    """Segment-PPO: --dense_reward reads a segment RM's values at the segments of the rule it was
    trained with (entropy here) while the policy's macro actions are fixed n-grams; the reference
    entropies are computed for the segment rule although the main rule does not need them."""
    import torch
    from transformers import AutoTokenizer

    from marlhf.models.reward_model import RewardModel, save_reward_model

    base, actor, _ = models
    torch.manual_seed(1)
    rm = RewardModel.from_pretrained(
        actor, init_std=0.02
    )  # a non-zero head: rewards vary per token
    seg_rm = tmp_path / "seg_rm"
    save_reward_model(
        rm,
        AutoTokenizer.from_pretrained(actor),
        seg_rm,
        rm_type="segment",
        score_stats={"mean": 0.0, "std": 1.0},
        normalizer={"a": 0.0, "b": 0.0, "c": 0.0, "d": 1.0},  # mean 0, std 1
        termination={"termination_condition": "entropy", "entropy_threshold": 1.0},
    )
    rows = _ppo(
        base,
        actor,
        seg_rm,
        tmp_path / "run",
        "--dense_reward",
        "--termination_condition",
        "fixed",
        "--ngram",
        "3",
    )
    assert len(rows) == 2
    for r in rows:
        assert all(math.isfinite(r[k]) for k in ("loss/policy", "loss/value", "objective/reward"))


@pytest.fixture(scope="module")
def dropout_models(models):
    """The tiny policy and reward model with dropout 0.1 in their configs (GPT-2 ships 0.1)."""
    base, actor, rm = models
    out = base / "dropout"
    for src in (actor, rm):
        dst = out / src.name
        shutil.copytree(src, dst)
        config = json.loads((dst / "config.json").read_text())
        assert config["attention_dropout"] == 0.0
        config["attention_dropout"] = 0.1
        (dst / "config.json").write_text(json.dumps(config))
    return base, out / actor.name, out / rm.name


def test_experience_without_dropout_and_ppo_without_dropout_by_default(dropout_models, tmp_path):
    """Experience is scored with dropout off, so at step 1 (actor == reference) the KL is 0; the
    update trains without dropout unless asked, so the first minibatch's ratio is 1. The whole
    rollout is one minibatch here, so the step's ratio statistics are the first minibatch's.

    π_old is scored by a forward pass here (``--recompute_old_logprobs``), the same computation as
    the reference's, so the KL is 0 to the last bit. By default π_old is what the static
    decoder recorded while sampling, also with dropout off: equal up to float rounding (checked at
    the end)."""
    base, actor, rm = dropout_models
    one_minibatch = (
        "--per_device_training_batch_size", "4", "--ppo_epochs", "1", "--recompute_old_logprobs",
    )  # fmt: skip
    rows = _ppo(base, actor, rm, tmp_path / "off", *one_minibatch, steps=1)
    assert abs(rows[0]["objective/kl"]) < 1e-6
    assert rows[0]["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert rows[0]["policy/approx_kl"] < 1e-9 and rows[0]["policy/clipfrac"] == 0.0
    saved = json.loads((tmp_path / "off" / "actor" / "config.json").read_text())
    assert saved["attention_dropout"] == 0.0
    # asked for, dropout stays in the update (not in the experience): the ratio moves off 1
    asked = ("--actor_dropout", "0.1", "--critic_dropout", "0.1")
    rows = _ppo(base, actor, rm, tmp_path / "on", *one_minibatch, *asked, steps=1)
    assert abs(rows[0]["objective/kl"]) < 1e-6
    assert abs(rows[0]["policy/ratio_mean"] - 1.0) > 1e-4
    # the default: π_old recorded by the decoder (dropout off there too), float rounding apart
    rows = _ppo(base, actor, rm, tmp_path / "reused", *one_minibatch[:-1], steps=1)
    assert abs(rows[0]["objective/kl"]) < 2e-5
    assert rows[0]["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert rows[0]["policy/approx_kl"] < 1e-9 and rows[0]["policy/clipfrac"] == 0.0


def test_critic_checkpoints_carry_their_ds_config_and_both_lrs_are_logged(models, tmp_path):
    base, actor, rm = models
    rates = ("--actor_learning_rate", "2e-5", "--critic_learning_rate", "8e-5")
    run = tmp_path / "run"
    rows = _ppo(base, actor, rm, run, "--save_steps", "1", *rates, steps=2)
    ds = json.loads((run / "ds_config.json").read_text())
    # every model directory was written aside and renamed: no partial one is left
    assert not [
        p for p in (*run.iterdir(), *(run / "checkpoints").iterdir()) if ".partial" in p.name
    ]
    for d in (run / "critic", run / "checkpoints" / "step-1" / "critic"):
        assert json.loads((d / "ds_config.json").read_text()) == ds["critic"], d
        assert (
            json.loads((d / "run_config.json").read_text())["models"]["critic"]["optim"][
                "learning_rate"
            ]
            == 8e-5
        )
    # 2 steps x 2 minibatches = 4 optimizer steps, linear decay from the peak, no warm-up: step 1's
    # update starts at optimizer step 0 (the peak), step 2's at optimizer step 2 (half the peak)
    assert [r["lr/actor"] for r in rows] == pytest.approx([2e-5, 1e-5], rel=1e-9)
    assert [r["lr/critic"] for r in rows] == pytest.approx([8e-5, 4e-5], rel=1e-9)


def test_resuming_an_older_checkpoint_restores_that_checkpoints_ema(models, tmp_path):
    """The EMA is saved with each checkpoint: a run resumed from step 1 after checkpoints at steps
    2 and 3 were written (a kill after a later save, or --resume of an older tag) ends with the
    uninterrupted run's EMA, not with one averaged from the later weights again."""
    import torch
    from safetensors.torch import load_file

    base, actor, rm = models
    flags = ("--enable_ema", "--ema_decay", "0.5", "--save_steps", "1", "--keep_checkpoints", "3")
    full = tmp_path / "full"
    rows = _ppo(base, actor, rm, full, *flags, steps=3)
    # each checkpoint's EMA shadow lies in its actor tag, listed in its checksums
    for step in (1, 2, 3):
        tag = full / "train_state" / "actor" / f"step-{step}"
        assert "ema.pt" in json.loads((tag / "checksums.json").read_text())["files"]
    # no checkpoint file names a class or function of the package: moving a module cannot make an
    # older checkpoint unreadable
    saved = sorted((full / "train_state").rglob("*.pt"))
    assert len(saved) >= 6 and "torch._utils" in set().union(*map(pickled_modules, saved))
    assert not any(m.split(".")[0] == "marlhf" for p in saved for m in pickled_modules(p))
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    (cut / "train_state" / "latest.json").write_text(json.dumps({"tag": "step-1", "step": 1}))
    (cut / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    _ppo(base, actor, rm, cut, *flags, steps=3)
    for d in ("actor", "actor_ema"):
        a = load_file(full / d / "model.safetensors")
        b = load_file(cut / d / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a), d
    # a damaged EMA shadow makes its checkpoint incomplete: the resume falls back to the one before
    from marlhf.runtime.checkpoint import find_resume

    ema = full / "train_state" / "actor" / "step-3" / "ema.pt"
    data = bytearray(ema.read_bytes())
    data[len(data) // 2] ^= 0xFF
    ema.write_bytes(bytes(data))
    assert find_resume(full / "train_state", "auto") == (full / "train_state", "step-2")


def test_runs_named_after_what_ran_one_line_per_step_and_compared(models, tmp_path):
    """PPO (n=1) and MA-PPO (n=5) runs: the log names them, prints one line per step without
    bars, and ``marlhf compare`` pools each arm's seeds into one report with its figures."""
    from marlhf.commands import main as marlhf

    base, actor, rm = models
    runs = {}
    for n, seed in ((1, 1), (1, 2), (5, 1), (5, 2)):
        out = tmp_path / f"n{n}_s{seed}"
        cmd = [sys.executable, "-m", "marlhf.stages.ppo", "--actor_model_name_or_path", str(actor),
               "--critic_model_name_or_path", str(rm), "--data_output_path", str(base / "cache"),
               "--max_prompt_seq_len", "160", "--max_answer_seq_len", "12",
               "--per_device_generation_batch_size", "4", "--per_device_training_batch_size", "2",
               "--max_steps", "2", "--ngram", str(n), "--seed", str(seed), "--data_seed", "1",
               "--output_dir", str(out), "--disable_progress_bar", "--report_to", "none"]  # fmt: skip
        proc = run_python(cmd, env=_env(base), capture_output=True, text=True, cwd=ROOT,
                              timeout=600)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[out] = proc.stderr
    label = {1: "PPO", 5: "MA-PPO n=5"}
    for out, err in runs.items():
        n = int(out.name[1])
        assert f"{label[n]}: " in err  # the start-up line names the algorithm
        steps = [line for line in err.splitlines() if f"{label[n]} step " in line]
        assert len(steps) == 2 and "score=" in steps[0] and "macro=" in steps[0]
        assert not (out / "tensorboard").exists()  # --report_to none
    report = tmp_path / "cmp"
    assert marlhf(["compare", str(tmp_path / "n1_s*"), str(tmp_path / "n5_s*"),
                   "--output", str(report), "--final_window", "1"]) == 0  # fmt: skip
    text = (report / "report.md").read_text()
    assert "- **PPO**:" in text and "- **MA-PPO n=5**:" in text  # arms named from run_config.json
    assert "| PPO | 2 |" in text and "| MA-PPO n=5 | 2 |" in text  # two seeds pooled per arm
    for stem in ("reward", "kl", "entropy", "length", "macro_len"):
        assert (report / f"{stem}.png").exists(), stem


def test_log_interval_thins_the_step_lines_and_each_evaluation_prints_one(models, tmp_path):
    """``--disable_progress_bar --log_interval 2``: the console's step lines and the metrics'
    training rows at steps 2 and 3 (the last); ``--eval_interval 2``: one console line per held-out
    evaluation, with the metrics logged."""
    base, actor, rm = models
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "marlhf.stages.ppo", "--actor_model_name_or_path", str(actor),
           "--critic_model_name_or_path", str(rm), "--data_output_path", str(base / "cache"),
           "--max_prompt_seq_len", "160", "--max_answer_seq_len", "12",
           "--per_device_generation_batch_size", "4", "--per_device_training_batch_size", "2",
           "--max_steps", "3", "--log_interval", "2", "--eval_interval", "2", "--eval_iters", "1",
           "--output_dir", str(out), "--disable_progress_bar", "--report_to", "none"]  # fmt: skip
    proc = run_python(cmd, env=_env(base), capture_output=True, text=True, cwd=ROOT,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stderr.splitlines()
    steps = [line.split("PPO step ")[1].split(":")[0] for line in lines if "PPO step " in line]
    assert steps == ["2/3", "3/3"]
    evals = [line.split("marlhf.ppo: ")[1] for line in lines if "{'eval/" in line]
    assert [e.split(":")[0] for e in evals] == ["step 2", "step 3"]
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows if "objective/score" in r] == [2, 3]
    logged = [r for r in rows if "eval/reward" in r]
    assert [r["step"] for r in logged] == [2, 3]
    for text, row in zip(evals, logged, strict=True):  # the console shows what was logged
        assert f"'eval/reward': {round(row['eval/reward'], 4)}" in text
