"""benchmarks/turn_credit.py: the plan (every arm's grid, its commands accepted by stage 3 with the
flags that make the arm), the selection on hand-made runs, and a resumable run at smoke size."""

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from benchmarks import turn_credit
from benchmarks.tuning import Setting


def test_the_default_arms_are_the_registered_cell_s(capsys, monkeypatch, tmp_path):
    with pytest.raises(SystemExit):
        turn_credit.main(["--arms", "ppo,vine"])
    err = capsys.readouterr().err
    assert "unknown arm(s) vine" in err and "macro_mc" in err
    studied = []
    monkeypatch.setattr(turn_credit, "run_study", lambda args, arms, *a, **k: studied.append(arms))
    turn_credit.main(["--output_dir", str(tmp_path)])  # no --arms: the main cell's four
    assert list(studied[0]) == ["ppo", "turn", "grpo", "mt_grpo"]


def test_a_relative_output_dir_is_the_callers_not_the_stages(monkeypatch, tmp_path):
    # the stages run in the repository root: a relative --output_dir is made absolute first, from
    # the directory the script was started in
    given = []
    monkeypatch.setattr(turn_credit, "run_study", lambda args, *a, **k: given.append(args))
    monkeypatch.chdir(tmp_path)
    turn_credit.main(["--output_dir", "out/tc"])
    assert given[0].output_dir == tmp_path / "out" / "tc"
    s = Setting(1.0, 1e-4)
    run = turn_credit.run_dir(given[0].output_dir, 4, "ppo", s, 11)
    cmd = turn_credit.stage_command(run, 4, "ppo", s, 11, turn_credit.SIZES["cpu"], None)
    assert Path(cmd[cmd.index("--output_dir") + 1]).is_absolute()


def test_grids_critic_arms_get_both_lams_critic_free_one():
    assert [s.label for s in turn_credit.settings_of("turn")] == [
        "λ=0.95, lr=1e-04", "λ=0.95, lr=2e-04", "λ=1, lr=1e-04", "λ=1, lr=2e-04",
    ]  # fmt: skip
    assert [s.label for s in turn_credit.settings_of("mt_grpo")] == [
        "λ=1, lr=1e-04", "λ=1, lr=2e-04",
    ]  # fmt: skip


def test_every_arms_command_parses_to_its_arm(tmp_path):
    from marlhf.cli import parse_config
    from marlhf.stages.ppo.config import PPOStageConfig

    size = turn_credit.SIZES["cpu"]
    want = {
        "ppo": ("gae", "fixed", 1), "turn": ("gae", "turn", None),
        "grpo": ("grpo", None, None), "mt_grpo": ("mt_grpo", None, None),
        "macro_mc": ("macro_mc", "turn", None),
    }  # fmt: skip
    assert set(want) == set(turn_credit.ARMS)
    for arm, (estimator, rule, ngram) in want.items():
        s = Setting(0.95, 2e-4)
        cmd = turn_credit.stage_command(tmp_path / arm, 4, arm, s, 12, size, '{"step_reward": 0.1}')
        assert cmd[1:3] == ["-m", "marlhf.stages.ppo"]
        cfg = parse_config(PPOStageConfig, cmd[3:])
        assert cfg.ppo.advantage_estimator == estimator
        assert cfg.env.env == "marlhf-trail-4" and cfg.env.env_config == '{"step_reward": 0.1}'
        assert cfg.ppo.lam == 0.95 and cfg.ppo.optim.seed == 12
        assert cfg.models.actor.optim.learning_rate == 2e-4
        if rule:
            assert cfg.macro.termination_condition == rule
        if ngram:
            assert cfg.macro.ngram == ngram
        if estimator != "gae":
            assert cfg.ppo.n_samples_per_prompt == 4
        if estimator == "macro_mc":  # every turn start after the first of a 4-turn game
            assert (cfg.ppo.mc_max_boundaries, cfg.ppo.mc_boundary_selection) == (3, "spread")


def _fake_run(out: Path, arm: str, s: Setting, seed: int, curve: list[float], held: float):
    run = turn_credit.run_dir(out, 4, arm, s, seed)
    run.mkdir(parents=True)
    with open(run / "metrics.jsonl", "w") as f:
        for step, g in enumerate(curve, 1):
            f.write(json.dumps({"step": step, "env/return": g}) + "\n")
    scores = {"gold": held, "first_call_key": held, "turns_mean": 4.0}
    (run / "eval.json").write_text(json.dumps({"T1": scores, "greedy": scores}))


def test_read_run_keeps_the_last_row_of_a_resumed_step(tmp_path):
    rows = [
        {"step": 1, "env/return": 0.1, "env/first_call_key": 0.0},
        {"step": 2, "env/return": 0.2, "env/first_call_key": 0.5},
        # a resumed run logs step 2 again, the last logged row counts; a row without the key: NaN
        {"step": 2, "env/return": 0.3},
        {"step": 3, "env/return": 0.4, "env/first_call_key": 1.0},
    ]
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert turn_credit.read_run(run) is None  # no eval.json: not finished
    (run / "eval.json").write_text(json.dumps({"T1": {"gold": 0.5}}))
    got = turn_credit.read_run(run)
    assert got["gold"] == [0.1, 0.3, 0.4]
    first = got["first_call"]
    assert first[0] == 0.0 and first[1] != first[1] and first[2] == 1.0
    assert got["eval"] == {"T1": {"gold": 0.5}}
    # with a per-turn reward the training gold is the logged gold, not the return
    paid = [
        {"step": 1, "env/return": 1.3, "env/gold": 1.0},
        {"step": 2, "env/return": 0.3, "env/gold": 0.0},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in paid))
    assert turn_credit.read_run(run)["gold"] == [1.0, 0.0]


def test_tuning_keeps_each_arms_best_setting_and_skips_incomplete_ones(tmp_path):
    a, b, c, d = turn_credit.settings_of("turn")
    for seed in (1, 2):
        _fake_run(tmp_path, "turn", a, seed, [0.2] * 5, 0.2)  # score 0.2
        _fake_run(tmp_path, "turn", c, seed, [0.6] * 5, 0.4)  # score 0.5: the best
        _fake_run(tmp_path, "turn", d, seed, [0.9] * 5, 0.9)
    d_seed2 = turn_credit.run_dir(tmp_path, 4, "turn", d, 2)
    (d_seed2 / "eval.json").unlink()  # d lacks a seed: not chosen
    chosen, lines = turn_credit.tuning_table(tmp_path, 4, ["turn"], [1, 2])
    assert chosen == {"turn": c}
    assert any("| turn | λ=1, lr=1e-04 | 2 | 0.600 | 0.400 | 0.500 |" == ln for ln in lines)


def test_report_speedup_against_ppo(tmp_path):
    s = Setting(0.95, 1e-4)
    for seed in (11, 12):
        _fake_run(tmp_path, "ppo", s, seed, [0.0] * 5 + [0.5] * 5, 0.5)
        _fake_run(tmp_path, "turn", s, seed, [0.0, 0.5] + [0.5] * 8, 0.7)
    lines = turn_credit.report(tmp_path, 4, {"ppo": s, "turn": s}, [11, 12])
    row = next(ln for ln in lines if ln.startswith("| turn |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # ppo's final (last 5) is 0.5; turn's 5-step trailing mean reaches it at step 6 (0,.5,.5,.5,.5)
    # -> 10 / 6; held-out +0.2 over ppo
    assert cells[5] == "0.700 ± 0.000" and cells[6] == "0.200 ± 0.000"
    assert cells[9] == "6" and cells[10].startswith("1.67")
    # ppo's own row: its trailing mean reaches its final gold at its last step (10), and it has no
    # speed-up over itself
    base = [c.strip() for c in lines[2].strip("|").split("|")]
    assert base[0] == "ppo" and base[9] == "10" and base[10] == "— (the baseline)"


def test_curve_table_blocks_and_run_means():
    runs = {
        "ppo": [{"gold": [0.0, 0.0, 1.0, 1.0]}, {"gold": [0.0, 1.0, 1.0, 1.0]}],
        "turn": [{"gold": [1.0, 1.0, 1.0, 1.0, 0.0]}],  # one step longer: cut to the common 4
    }
    lines = turn_credit.curve_table(runs, parts=2)
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.strip("|").split("|")]
            for ln in lines if ln.startswith("| ppo") or ln.startswith("| turn")}  # fmt: skip
    # ppo: blocks (0+0.5)/2 = 0.25 and 1.0; run means 0.5 and 0.75
    assert rows["ppo"][2] == "0.25, 1.00" and rows["ppo"][3].startswith("0.625 ± ")
    # turn: 1.0 over its first 4 steps; one seed, so no interval of its own
    assert rows["turn"][2] == "1.00, 1.00" and rows["turn"][3] == "1.000"
    assert rows["turn"][4].startswith("0.375")


def test_pair_table_welch_differences_between_two_arms():
    def run(curve, held):
        return {"gold": curve, "eval": {"T1": {"gold": held}}}

    runs = {
        "a": [run([0.0] * 5 + [1.0] * 5, 0.9), run([0.0] * 10, 0.7)],
        "b": [run([0.0] * 10, 0.5), run([0.0] * 10, 0.5)],
        "c": [],  # no runs: its pair is left out
    }
    lines = turn_credit.pair_table(runs, [("a", "b"), ("a", "c")])
    assert len(lines) == 3
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    # a's finals 1.0 and 0.0, b's 0 and 0: +0.5; held +0.8 - 0.5 = +0.3; run means 0.5, 0 -> +0.25
    assert cells[0] == "a − b"
    assert cells[1].startswith("0.500 ± ") and cells[2].startswith("0.300 ± ")
    assert cells[3].startswith("0.250 ± ")


def test_run_and_eval_counts_its_own_stage_cpu_beside_another_worker(tmp_path):
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    idle = "import time; time.sleep(1.5)"
    jobs = [(tmp_path / "idle", idle), (tmp_path / "busy", busy)]
    with ThreadPoolExecutor(2) as pool:  # the busy stage ends inside the idle one's run
        list(pool.map(lambda j: turn_credit.run_and_eval(
            j[0], [sys.executable, "-c", j[1]], lambda r: {"T1": {"gold": 0.5}}, "gold"), jobs))  # fmt: skip
    ev = {j[0].name: json.loads((j[0] / "eval.json").read_text()) for j in jobs}
    assert ev["busy"]["cpu_s_stage"] >= 0.55
    assert ev["idle"]["cpu_s_stage"] < 0.3  # its own start-up only, not the busy stage's 0.6 s
    assert ev["idle"]["wall_s"] >= 1.5 and ev["idle"]["T1"] == {"gold": 0.5}
    # done once: the same call again skips it
    assert turn_credit.run_and_eval(jobs[0][0], ["false"], None, "gold").endswith("done already")


@pytest.mark.slow
def test_smoke_run_end_to_end_and_resume(tmp_path, capsys):
    argv = [
        "--size",
        "smoke",
        "--arms",
        "ppo,mt_grpo",
        "--seeds",
        "1",
        "--output_dir",
        str(tmp_path),
    ]
    assert turn_credit.main(argv) == 0
    out = capsys.readouterr().out
    assert "| ppo | λ=0.95, lr=1e-04 | 1 |" in out and "| mt_grpo | λ=1, lr=1e-04 | 1 |" in out
    run = turn_credit.run_dir(tmp_path, 4, "mt_grpo", Setting(1.0, 1e-4), 1)
    ev = json.loads((run / "eval.json").read_text())
    assert (
        0 <= ev["T1"]["gold"] <= 1
        and ev["T1"]["turns_mean"] > 1
        and ev["cpu_s_stage"] > 0
        and ev["cpu_s_held_out"] > 0
    )
    assert turn_credit.main(argv) == 0
    assert capsys.readouterr().out.count("done already") == 2
