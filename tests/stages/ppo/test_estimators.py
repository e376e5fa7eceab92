"""The advantage estimators in the real stage: every estimator at every ratio level with
every termination rule trains end to end; the critic-free ones build, train and save no critic; a
killed grpo or macro_mc run resumes to the uninterrupted run's metrics.

The matrix is 6 estimators × 3 ratio levels × 5 termination rules = 90 one-step runs of the tiny
model, trained one after another in one process (``ppo_matrix.py``: one DeepSpeed start-up, about
0.5 s per run, 1.5 s for macro_mc). The other settings rotate over the cases so that each is covered
somewhere: the four loss aggregations, the KL loss, the static decoder, advantage whitening,
``--macro_reward_agg weighted`` and, for macro_mc, one or two samples per prompt (the prompt's
value from its own continuations or from the group).
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import sys
from pathlib import Path

import pytest

from marlhf.runtime.tracking import read_metrics
from tests.support.forked import run_python
from tests.support.stage_env import stage_env as _env

ROOT = Path(__file__).resolve().parents[3]
MATRIX = Path(__file__).resolve().parents[2] / "support" / "ppo_matrix.py"
pytestmark = pytest.mark.slow

ESTIMATORS = ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "macro_mc")
LEVELS = ("token", "macro", "sequence")
RULES = {
    "fixed": ("--termination_condition", "fixed", "--ngram", "3"),
    "randomized": ("--termination_condition", "randomized", "--ngram_choices", "1,2,3"),
    "ppl": ("--termination_condition", "ppl"),
    "entropy": ("--termination_condition", "entropy", "--target_macro_len", "3"),
    "parsing": (
        "--termination_condition", "parsing", "--parser_backend", "python", "--parsing_cutoff", "4",
    ),
    "lowprob": ("--termination_condition", "lowprob", "--target_macro_len", "3"),
    # words as steps: the tiny task's answers have no newlines
    "step": ("--termination_condition", "step", "--step_delimiter", " "),
}  # fmt: skip
AGG = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
CRITIC_FREE = {"grpo", "dr_grpo", "rloo", "reinforce_pp", "macro_mc"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny policy and a reward model on it (a non-zero head, so scores differ)."""
    import torch
    from transformers import AutoTokenizer

    from marlhf.models.reward_model import RewardModel, save_reward_model
    from marlhf.models.zoo import build_tiny

    base = tmp_path_factory.mktemp("ppo_est")
    actor = build_tiny(base / "actor")
    torch.manual_seed(0)
    save_reward_model(
        RewardModel.from_pretrained(actor, init_std=0.02),
        AutoTokenizer.from_pretrained(actor),
        base / "rm",
        score_stats={"mean": 0.0, "std": 1.0},
    )
    return base


def _common(base: Path) -> list[str]:
    return [
        "--actor_model_name_or_path", str(base / "actor"),
        "--data_output_path", str(base / "cache"),
        "--max_prompt_seq_len", "160", "--max_answer_seq_len", "12",
        "--per_device_generation_batch_size", "4", "--per_device_training_batch_size", "2",
        "--disable_progress_bar",
    ]  # fmt: skip


def _case_flags(i: int, est: str, level: str, rule: str) -> list[str]:
    """One matrix case's flags; the rotating settings follow the case number ``i``."""
    G = 2 if est in ("grpo", "dr_grpo", "rloo") or (est == "macro_mc" and i % 2) else 1
    flags = [
        "--advantage_estimator", est, "--ratio_level", level, *RULES[rule],
        "--n_samples_per_prompt", str(G), "--max_steps", "1",
    ]  # fmt: skip
    # gae keeps the critic (the reward model initialises it); the others get only the reward model
    model = "--critic_model_name_or_path" if est == "gae" else "--reward_model_name_or_path"
    flags += [model, "RM"]
    if est != "dr_grpo":  # dr_grpo has its own loss aggregation
        flags += ["--loss_agg_mode", AGG[i % 4]]
    if i % 3 == 0:
        flags += ["--kl_loss_coef", "0.1", "--kl_loss_type", ("k1", "k2", "k3")[i % 9 // 3]]
    if i % 2 == 0:
        flags += ["--generation_backend", "static"]
    if i % 5 == 1:
        flags += ["--whiten_advantages"]
    if est == "gae" and i % 4 == 2:
        flags += ["--macro_reward_agg", "weighted"]
    if est == "macro_mc":
        flags += ["--mc_rollouts", "2", "--mc_max_boundaries", "2"]
    if boundary_credit(i, est, level):
        flags += ["--macro_credit", "boundary"]
    return flags


def boundary_credit(i: int, est: str, level: str) -> bool:
    """Every other per-macro-estimator case at the token ratio trains its boundary tokens only."""
    return est in ("gae", "macro_mc") and level == "token" and i % 2 == 1


CASES = {
    f"{est}-{level}-{rule}": (est, level, rule)
    for est, level, rule in itertools.product(ESTIMATORS, LEVELS, RULES)
}


def _run_matrix(base: Path, runs: dict[str, list[str]], name: str, timeout: int):
    """Trains every run of ``runs`` ({name: stage flags}) in one process (the matrix runner);
    returns ({run: error} of the runs that failed, the runner's stderr)."""
    spec = base / f"{name}.json"
    spec.write_text(json.dumps(runs))
    proc = run_python(
        [sys.executable, str(MATRIX), str(spec)],
        env=_env(base),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(Path(str(spec) + ".errors.json").read_text()), proc.stderr


@pytest.fixture(scope="module")
def matrix(models):
    """Every case trained one step (one process); returns (base, {case: output dir}, errors, log)."""
    base = models
    cases, outs = {}, {}
    for i, (name, (est, level, rule)) in enumerate(CASES.items()):
        flags = [str(base / "rm") if f == "RM" else f for f in _case_flags(i, est, level, rule)]
        outs[name] = base / "matrix" / name
        cases[name] = [*_common(base), *flags, "--output_dir", str(outs[name])]
    errors, stderr = _run_matrix(base, cases, "cases", timeout=1200)
    return base, outs, errors, stderr


@pytest.mark.parametrize("case", list(CASES))
def test_every_estimator_level_and_rule_trains(matrix, case):
    _, outs, errors, _ = matrix
    assert case not in errors, errors.get(case)
    est, level, rule = CASES[case]
    out = outs[case]
    (row,) = read_metrics(out / "metrics.jsonl")
    assert row["step"] == 1
    for key in ("objective/score", "objective/kl", "loss/policy", "policy/clipfrac", "macro/count"):
        assert math.isfinite(row[key]), key
    run = json.loads((out / "run_config.json").read_text())
    assert (run["ppo"]["advantage_estimator"], run["ppo"]["ratio_level"]) == (est, level)
    assert run["macro"]["termination_condition"] == rule
    ds = json.loads((out / "ds_config.json").read_text())
    engines = json.loads((out / "train_state" / "latest.json").read_text())["engines"]
    if est in CRITIC_FREE:
        # no critic built, trained, saved or checkpointed; no critic metrics
        assert not (out / "critic").exists() and "critic" not in ds and engines == ["actor"]
        assert not any(k.startswith("value/") or k == "lr/critic" for k in row), row
        assert "loss/value" not in row
    else:
        assert (out / "critic" / "reward_config.json").exists() and "critic" in ds
        assert engines == ["actor", "critic"] and math.isfinite(row["loss/value"])
    if est == "macro_mc":
        # K = 2 continuations at each of the 4 responses' boundaries, and at the prompt if G = 1
        with_prompt = run["ppo"]["n_samples_per_prompt"] == 1
        assert row["mc/continuations"] == pytest.approx(
            2 * 4 * (with_prompt + row["mc/boundaries"])
        )
        assert row["time/mc"] > 0
        assert row["mc/boundaries"] <= 2  # --mc_max_boundaries
    if run["ppo"]["n_samples_per_prompt"] > 1:
        assert "group/score_std" in row
    if run["ppo"]["kl_loss_coef"] > 0:
        assert math.isfinite(row["loss/kl"])
    # --macro_credit boundary: one trained token per macro action
    if run["macro"]["macro_credit"] == "boundary":
        share = row["macro/count"] / row["response/length"]
        assert row["macro/credit_share"] == pytest.approx(share, rel=1e-6)
    else:
        assert "macro/credit_share" not in row
    if rule == "lowprob":
        assert 0.0 <= row["macro/lowprob_threshold"] <= 1.0


def test_critic_free_runs_say_so_in_the_log(matrix):
    _, _, _, log = matrix
    for est in CRITIC_FREE:
        n = log.count(f"no critic: --advantage_estimator {est} needs none")
        assert n == len(LEVELS) * len(RULES), (est, n)
    assert "no critic: --advantage_estimator gae" not in log


# --------------------------------------------------------------------------------------------------
# kill and resume


RESUME = {
    # the hf decoder draws from the global RNG (restored from the checkpoint)
    "grpo": ("--advantage_estimator", "grpo", "--n_samples_per_prompt", "2",
             "--termination_condition", "randomized", "--ngram_choices", "1,2,3"),
    # the static decoder's continuations are seeded from (seed, step, row, boundary, k)
    "macro_mc": ("--advantage_estimator", "macro_mc", "--generation_backend", "static",
                 "--termination_condition", "fixed", "--ngram", "3", "--mc_rollouts", "2",
                 "--mc_max_boundaries", "2"),
}  # fmt: skip


def _train_all(base: Path, runs: dict[str, list[str]], name: str) -> None:
    errors, _ = _run_matrix(base, runs, name, timeout=900)
    assert not errors, errors


def test_kill_and_resume_reproduces_the_uninterrupted_run(models, tmp_path):
    base = models
    flags = {
        est: [*_common(base), "--reward_model_name_or_path", str(base / "rm"), *extra,
              "--max_steps", "4", "--save_steps", "2"]
        for est, extra in RESUME.items()
    }  # fmt: skip
    full = {est: [*f, "--output_dir", str(tmp_path / est / "full")] for est, f in flags.items()}
    _train_all(tmp_path, full, "full")
    for est in RESUME:
        src, cut = tmp_path / est / "full", tmp_path / est / "cut"
        assert (src / "checkpoints" / "step-2" / "actor" / "config.json").exists()
        assert not (src / "train_state" / "critic").exists()
        # a kill right after the step-2 checkpoint
        shutil.copytree(src, cut)
        (cut / "train_state" / "latest.json").write_text(
            json.dumps({"tag": "step-2", "step": 2, "engines": ["actor"]})
        )
        rows = read_metrics(src / "metrics.jsonl")
        (cut / "metrics.jsonl").write_text(
            "\n".join(json.dumps(r) for r in rows if r["step"] <= 2) + "\n"
        )
    _train_all(
        tmp_path,
        {est: [*f, "--output_dir", str(tmp_path / est / "cut")] for est, f in flags.items()},
        "resumed",
    )
    for est in RESUME:
        a = {r["step"]: r for r in read_metrics(tmp_path / est / "full" / "metrics.jsonl")}
        b = {r["step"]: r for r in read_metrics(tmp_path / est / "cut" / "metrics.jsonl")}
        assert sorted(b) == [1, 2, 3, 4]
        for step in (3, 4):
            assert set(a[step]) == set(b[step])
            for key, value in a[step].items():
                if key.startswith("time") or key == "step":
                    continue
                assert b[step][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (est, step, key)
        if est == "macro_mc":
            assert a[4]["mc/continuations"] > 0
