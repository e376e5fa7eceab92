"""PPO, MA-PPO, grpo and macro_mc trained end to end through ``--generation_backend vllm`` on CPU
(real DeepSpeed, the stage as a subprocess, ``tests/support/vllm_record.py`` recording each weight sync).
Runs where vLLM is installed (``make test-vllm``: ``.venv-vllm``).

At every sync after an actor update the recorder compares, on the rank's last rollout, the engine's
log-probs with the trainer's (the actor's forward pass, as scoring computes π_old): they differ by
the update just before the sync (the engine still has the old weights) and agree after it. And the
log-probs the engine recorded while sampling equal π_old as the trainer scores it (the engine had
the actor's weights). Also: ZeRO-3 on two ranks (each rank gathers one parameter at a time), LoRA
(merged), a run killed with SIGKILL after a checkpoint and resumed, which continues exactly as the
uninterrupted run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from marlhf.runtime.distributed import free_port
from marlhf.runtime.tracking import read_metrics
from tests.support.stage_env import run_stage, stage_env

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")
pytestmark = pytest.mark.slow

RECORD = Path(__file__).resolve().parents[1] / "support" / "vllm_record.py"
ROOT = Path(__file__).resolve().parents[2]
# the engine's log-probs against the trainer's, fp32 on CPU: measured up to 2e-5 (after a sync, and
# the engine's record against scoring's π_old); an update moves them by more than 1e-2
TOL = 1e-4
FLAGS = (
    "--generation_backend", "vllm", "--max_prompt_seq_len", "160", "--max_answer_seq_len", "12",
    "--per_device_generation_batch_size", "4", "--per_device_training_batch_size", "2",
    "--actor_learning_rate", "1e-3", "--temperature", "1.0", "--top_k", "20", "--top_p", "0.95",
    "--disable_progress_bar", "--seed", "7",
)  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """``tiny-base`` as the actor and a reward model on it (random head)."""
    from transformers import AutoTokenizer

    from marlhf.models.load import resolve_model_path
    from marlhf.models.reward_model import RewardModel, save_reward_model

    base = tmp_path_factory.mktemp("vllm_ppo")
    actor = resolve_model_path("tiny-base")
    torch.manual_seed(0)
    save_reward_model(
        RewardModel.from_pretrained(actor),
        AutoTokenizer.from_pretrained(actor),
        base / "rm",
        score_stats={"mean": 0.0, "std": 1.0},
    )
    return base


def _cmd(base: Path, out: Path, *extra: str, launcher=None) -> list[str]:
    launch = launcher or [sys.executable]
    return [
        *launch, str(RECORD), "--actor_model_name_or_path", "tiny-base",
        "--critic_model_name_or_path", str(base / "rm"), "--data_output_path", str(base / "cache"),
        *FLAGS, *extra, "--output_dir", str(out),
    ]  # fmt: skip


def _syncs(out: Path, rank: int = 0) -> list[dict]:
    files = sorted(
        (out / "record").glob(f"sync-*-rank-{rank}.pt"), key=lambda p: int(p.stem.split("-")[1])
    )
    return [torch.load(f, weights_only=False) for f in files]


def _check_syncs(out: Path, steps: int, rank: int = 0) -> None:
    syncs = _syncs(out, rank)
    assert len(syncs) == steps
    for k, s in enumerate(syncs, 1):
        assert s["before"] > 10 * TOL, (k, s)  # the update moved the actor away from the engine
        assert s["after"] < TOL, (k, s)  # the sync brought the engine to it
        assert s["sampled_vs_scored"] < TOL, (k, s)  # sampled with the actor's weights
        # every scoring: the engine's record the behaviour policy, the actor's score π_old
        assert s["behaviour"] == len(s["responses"]) > 0, (k, s)


def _check_rollout_metrics(rows: list[dict]) -> None:
    """rollout/* logged on every step (the trainer scores vLLM's π_old anyway), near 0 in fp32."""
    for r in rows:
        assert r["rollout/logprob_diff_max"] < TOL, r
        assert 0 <= r["rollout/k3_kl"] < 1e-8, r
        for lvl in ("token", "macro", "seq"):  # fp32: ratios within float rounding of 1
            lo, hi = r[f"rollout/ratio_min_{lvl}"], r[f"rollout/ratio_max_{lvl}"]
            assert 1 - 1e-3 < lo <= hi < 1 + 1e-3, (lvl, r)


@pytest.fixture(scope="module")
def ppo(models) -> Path:
    """Token-level PPO with a critic, 4 steps, checkpoints every 2."""
    out = models / "ppo"
    run_stage(_cmd(models, out, "--max_steps", "4", "--save_steps", "2"), models / "home")
    return out


def test_ppo_trains_through_vllm_with_synced_weights(ppo):
    _check_syncs(ppo, 4)
    rows = read_metrics(ppo / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["time/sync"] > 0 and "value/mean" in r for r in rows)
    _check_rollout_metrics(rows)  # --mismatch_check_every 10 would check step 1 only
    weights = torch.load(ppo / "record" / "weights-rank-0.pt", weights_only=False)
    assert weights and all(w["weights"] is None for w in weights)  # fp32: auto is `none`
    assert (ppo / "actor" / "config.json").exists() and (ppo / "critic").is_dir()


def test_held_out_evaluation_through_vllm(models):
    """--eval_interval with the vLLM backend: the held-out prompts are sampled by the run's
    engine (as the rollouts are), after the last step."""
    out = models / "eval"
    extra = ("--max_steps", "2", "--eval_interval", "2", "--eval_iters", "1")
    run_stage(_cmd(models, out, *extra), models / "home")
    rows = read_metrics(out / "metrics.jsonl")
    evals = [r for r in rows if "eval/reward" in r]
    assert [r["step"] for r in evals] == [2]
    e = evals[0]
    assert 0 < e["eval/response_len"] <= 12 and 0 <= e["eval/ends_with_eos"] <= 1
    assert "eval/score" in e and "eval/gold" in e  # a reward model, the synthetic task
    _check_syncs(out, 2)  # the engine still follows the actor


def test_a_run_stopped_on_purpose_ends_in_one_error_line(models):
    """An error raised on purpose mid-training (after the engine is built) ends the run with one
    `error:` line: the engine is shut down before the process group is torn down, so vLLM's own
    teardown at exit adds no second traceback ("Invalid process group specified")."""
    import subprocess

    out = models / "failed"
    cmd = _cmd(models, out, "--max_steps", "3")
    env = {**stage_env(models / "home"), "MARLHF_RECORD_FAIL_AT_SYNC": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: a recorded failure at weight sync 1"], proc.stderr[-3000:]
    # vLLM logs a traceback of its own chat-template warm-up as a warning (its logger's prefix);
    # a Python traceback of the program starts a line
    tracebacks = [
        line for line in proc.stderr.splitlines()
        if line.startswith(("Traceback", "[rank0]: Traceback"))
    ]  # fmt: skip
    assert tracebacks == [] and "Invalid process group" not in proc.stderr, proc.stderr[-3000:]


def test_killed_run_resumes_as_if_uninterrupted(models, ppo):
    import subprocess

    out = models / "killed"
    cmd = _cmd(models, out, "--max_steps", "4", "--save_steps", "2")
    env = {**stage_env(models / "home"), "MARLHF_RECORD_KILL_AT_STEP": "2"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert len(read_metrics(out / "metrics.jsonl")) == 2
    run_stage(cmd, models / "home")  # resumes from step 2: the engine gets the resumed actor
    a = {r["step"]: r for r in read_metrics(ppo / "metrics.jsonl")}
    b = {r["step"]: r for r in read_metrics(out / "metrics.jsonl")}
    assert sorted(b) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in (
            "objective/score",
            "objective/kl",
            "loss/policy",
            "loss/value",
            "response/length",
        ):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-5, abs=1e-6), (step, key)
    # the resumed run sampled the uninterrupted run's responses
    for s_a, s_b in zip(_syncs(ppo)[2:], _syncs(out)[-2:], strict=True):
        assert all(
            torch.equal(x, y) for x, y in zip(s_a["responses"], s_b["responses"], strict=True)
        )


def test_mappo_n5_with_lora_merged_into_the_engine(models):
    out = models / "mappo_lora"
    extra = ("--termination_condition", "fixed", "--ngram", "5", "--actor_lora_dim", "4",
             "--max_steps", "2")  # fmt: skip
    run_stage(_cmd(models, out, *extra), models / "home")
    _check_syncs(out, 2)
    rows = read_metrics(out / "metrics.jsonl")
    assert rows[-1]["macro/mean_len"] > 1.0


# the masked correction's band, log C = 5e-6: inside the fp32 engine-trainer differences
# (measured up to 2e-5), so it can drop tokens
MIS_CAP = 1.000005


def test_grpo_trains_through_vllm_with_the_rollout_correction(models):
    """The correction weights each policy-loss term by π_trainer / π_vLLM (here `mis`: ρ inside
    [1/C, C], else 0), computed from the engine's record and the actor's score."""
    out = models / "grpo"
    extra = ("--advantage_estimator", "grpo", "--n_samples_per_prompt", "2", "--reward_source",
             "gold", "--max_steps", "2", "--rollout_correction", "mis",
             "--rollout_is_cap", str(MIS_CAP))  # fmt: skip
    run_stage(_cmd(models, out, *extra), models / "home")
    _check_syncs(out, 2)
    rows = read_metrics(out / "metrics.jsonl")
    assert "group/score_std" in rows[-1] and not (out / "critic").exists()
    _check_rollout_metrics(rows)
    weights = torch.load(out / "record" / "weights-rank-0.pt", weights_only=False)
    assert len(weights) >= 2
    kept = changed = 0
    log_cap = torch.tensor(MIS_CAP).log()  # float32, as the flag's value is used
    for w in weights:  # against ρ and the band computed here, token by token
        mask = w["mask"]
        log_rho = w["trainer"].float() - w["rollout"].float()
        inside = (log_rho.abs() <= log_cap) & mask
        want = torch.where(inside, log_rho.exp(), torch.zeros_like(log_rho))
        torch.testing.assert_close(w["weights"], want, rtol=1e-6, atol=0)
        kept += int(inside.sum())
        changed += int((w["weights"][mask] != 1).sum())
    assert kept > 0 and changed > 0, (kept, changed)  # the weights are not all 1: applied


def test_zero3_on_two_ranks_with_macro_mc(models):
    """Each rank its own engine, synced by gathering one parameter at a time; the ``macro_mc``
    continuations are drawn by the engine too."""
    out = models / "zero3"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", str(free_port())]  # fmt: skip
    extra = ("--actor_zero_stage", "3", "--advantage_estimator", "macro_mc", "--reward_source",
             "gold", "--mc_rollouts", "2", "--mc_max_boundaries", "2", "--ngram", "3",
             "--max_steps", "2", "--per_device_generation_batch_size", "2")  # fmt: skip
    run_stage(_cmd(models, out, *extra, launcher=launcher), models / "home")
    for r in (0, 1):
        _check_syncs(out, 2, rank=r)
    rows = read_metrics(out / "metrics.jsonl")
    assert all(r["mc/continuations"] > 0 for r in rows)
