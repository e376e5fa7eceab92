"""benchmarks/reasoning_credit.py: every arm's grid and its command accepted by stage 3 with the
flags that make the arm, macro_mc's boundaries at the step starts of a real solution, the selection
and the report on hand-made runs, and the held-out figures of one task."""

import itertools
import json
from pathlib import Path

import pytest
import torch

from benchmarks import reasoning_credit as rc
from benchmarks import turn_credit
from benchmarks.tuning import Setting


def test_grids_critic_arms_get_both_lams_critic_free_one():
    for arm in ("ppo", "step", "fixed10", "lowprob10"):
        assert [s.label for s in rc.settings_of(arm)] == [
            "λ=0.95, lr=1e-04", "λ=0.95, lr=2e-04", "λ=1, lr=1e-04", "λ=1, lr=2e-04",
        ], arm  # fmt: skip
    for arm in ("grpo", "dr_grpo", "macro_mc"):
        assert [s.label for s in rc.settings_of(arm)] == ["λ=1, lr=1e-04", "λ=1, lr=2e-04"], arm


def _config(tmp_path, arm, steps=4, s=Setting(0.95, 2e-4)):
    from marlhf.cli import parse_config
    from marlhf.stages.ppo.config import PPOStageConfig

    cmd = rc.stage_command(tmp_path / arm, steps, arm, s, 12, rc.SIZES["cpu"])
    assert cmd[1:3] == ["-m", "marlhf.stages.ppo"]
    return parse_config(PPOStageConfig, cmd[3:])


def test_every_arms_command_parses_to_its_arm(tmp_path):
    # arm: estimator, rule, ngram, target_macro_len, group size
    want = {
        "ppo": ("gae", "fixed", 1, None, 1), "step": ("gae", "step", None, None, 1),
        "fixed10": ("gae", "fixed", 10, None, 1), "lowprob10": ("gae", "lowprob", None, 10, 1),
        "grpo": ("grpo", "fixed", 1, None, 4), "dr_grpo": ("dr_grpo", "fixed", 1, None, 4),
        "macro_mc": ("macro_mc", "step", None, None, 4),
    }  # fmt: skip
    assert set(want) == set(rc.ARMS)
    for arm, (estimator, rule, ngram, target, group) in want.items():
        cfg = _config(tmp_path, arm)
        assert cfg.ppo.advantage_estimator == estimator, arm
        assert cfg.macro.termination_condition == rule, arm
        if ngram:
            assert cfg.macro.ngram == ngram, arm
        if target:
            assert cfg.macro.target_macro_len == target, arm
        assert cfg.ppo.n_samples_per_prompt == group, arm
        assert cfg.ppo.reward_source == "gold" and cfg.data.data_path == ("synthetic-arith-4",)
        assert cfg.ppo.lam == 0.95 and cfg.ppo.optim.seed == 12
        assert cfg.models.actor.optim.learning_rate == 2e-4
    mc = _config(tmp_path, "macro_mc", steps=16)
    assert mc.ppo.mc_boundary_selection == "spread" and mc.ppo.mc_max_boundaries == 32
    assert mc.data.data_path == ("synthetic-arith-16",)


def test_macro_mc_continues_from_every_step_start(tmp_path):
    """On a real 4-step solution in the base's tokens, macro_mc's boundaries are the tokens that
    follow each newline (the starts of lines 2-5), found here from the text alone."""
    from transformers import AutoTokenizer

    from marlhf.data.reasoning_tasks import solution
    from marlhf.macro.segments import build_segments
    from marlhf.macro.step import StepRule
    from marlhf.macro.termination import TerminationInputs
    from marlhf.models.zoo import ensure_arith_base
    from marlhf.stages.ppo.mc import mc_boundaries

    cfg = _config(tmp_path, "macro_mc")
    tok = AutoTokenizer.from_pretrained(ensure_arith_base())
    ops = [("minus", 4)] * 4
    texts = [solution(25, ops), solution(9, [("plus", 3)] * 4)]
    rows = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    A = max(map(len, rows))
    ids = torch.tensor([r + [0] * (A - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (A - len(r)) for r in rows]).bool()
    ends = StepRule(cfg.macro, tok)(TerminationInputs(ids, mask, torch.tensor([True, True])))
    segments = build_segments(ends.macro_end, mask)
    b = mc_boundaries(segments, cfg.ppo, 96)
    for row, r in enumerate(rows):
        # token i starts a line when the text decoded up to it ends with a newline
        starts = [i for i in range(1, len(r)) if tok.decode(r[:i]).endswith("\n")]
        assert len(starts) == 4  # four step lines, then the answer line
        assert b.positions[row][b.mask[row]].tolist() == starts


def _fake_run(out: Path, arm: str, s: Setting, seed: int, curve, held: float, lines=0.5, first=0.5):
    run = rc.run_dir(out, 4, arm, s, seed)
    run.mkdir(parents=True)
    with open(run / "metrics.jsonl", "w") as f:
        for step, g in enumerate(curve, 1):
            f.write(json.dumps({"step": step, "objective/gold": g, "time/step": 1.0}) + "\n")
    scores = {"accuracy": held, "gold": held, "line_accuracy": lines, "first_operation": first}
    (run / "eval.json").write_text(json.dumps({"T1": scores, "greedy": scores}))


def test_tuning_keeps_each_arms_best_setting_and_skips_incomplete_ones(tmp_path):
    a, _, c, d = rc.settings_of("step")
    # setting: (training accuracy at every step, held-out accuracy); scores a 0.2, c 0.5, d 0.9
    runs = {a: (0.2, 0.2), c: (0.6, 0.4), d: (0.9, 0.9)}
    for (setting, (train, held)), seed in itertools.product(runs.items(), (1, 2)):
        _fake_run(tmp_path, "step", setting, seed, [train] * 5, held)
    (rc.run_dir(tmp_path, 4, "step", d, 2) / "eval.json").unlink()  # d lacks a seed: not chosen
    chosen, lines = rc.tuning_table(
        tmp_path, 4, ["step"], [1, 2], read=rc.reader(tmp_path, 4), settings=rc.settings_of
    )
    assert chosen == {"step": c}
    assert "| step | λ=1, lr=1e-04 | 2 | 0.600 | 0.400 | 0.500 |" in lines


def test_report_speedup_and_differences_against_ppo(tmp_path):
    s = Setting(0.95, 1e-4)
    for seed, held_ppo, held_step in ((11, 0.2, 0.5), (12, 0.3, 0.6)):
        _fake_run(tmp_path, "ppo", s, seed, [0.0] * 6 + [0.5] * 6, held_ppo)
        _fake_run(
            tmp_path, "step", s, seed, [0.0, 0.0, 0.5] + [0.5] * 9, held_step, 0.75, seed / 20
        )
    extra = (rc.LINES, rc.FIRST_OPERATION)
    lines = rc.report(
        tmp_path, 4, {"ppo": s, "step": s}, [11, 12], read=rc.reader(tmp_path, 4), extra=extra
    )
    assert "step lines right (T=1) | first operation right (T=1) |" in lines[0]
    assert lines[1] == "|---" * 12 + "|"
    row = next(ln for ln in lines if ln.startswith("| step |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # ppo's final (mean of the last 5 steps) is 0.5; step's trailing-5 mean (0, 0, .5, .5, .5, .5,
    # .5 ...) is 0.3 at step 5, 0.4 at 6, 0.5 at 7 -> reaches it at step 7: 12 / 7 = 1.71.
    # Held-out: step 0.55, se 0.05, t(0.975, 1) = 12.706 -> ± 0.635; minus ppo's 0.25: 0.30, equal
    # variances (0.005 each) give Welch's df = 2, t(0.975, 2) = 4.3027, se sqrt(0.0025 * 2) -> ± 0.304
    assert cells[5] == "0.550 ± 0.635"
    assert cells[6] == "0.300 ± 0.304"
    assert cells[8] == "0.750 ± 0.000"
    # first operation 0.55 and 0.60: mean 0.575, se 0.025, ± 12.706 * 0.025 = 0.318
    assert cells[9] == "0.575 ± 0.318"
    assert cells[10] == "7" and cells[11].startswith("1.71")


def test_held_out_figures_of_one_task(tmp_path):
    from marlhf.models.zoo import ensure_arith_base
    from marlhf.pipeline.figures import arith_figures

    figures = arith_figures(ensure_arith_base(), 2, tasks=("synthetic-arith-4",))
    assert set(figures) == {"prompts_per_task", "synthetic-arith-4/greedy", "synthetic-arith-4/T1"}
    with pytest.raises(ValueError, match="synthetic-arith-5"):
        arith_figures(ensure_arith_base(), 2, tasks=("synthetic-arith-5",))


def test_sizing_keeps_each_documented_command_within_an_hour():
    """Each phase of the cpu size, two workers on two cores, by the module's measurement."""
    cpu = rc.SIZES["cpu"]
    critic = ["ppo", "step", "fixed10", "lowprob10"]  # the arms with GAE: λ is tuned
    assert [a for a in rc.ARMS if len(rc.settings_of(a)) == 4] == critic
    tune = [(None, a, s, seed) for seed in (1, 2, 3) for a in rc.ARMS for s in rc.settings_of(a)]
    assert len(tune) == 3 * (4 * len(critic) + 2 * (len(rc.ARMS) - len(critic)))
    for arms in rc.REPORT_GROUPS:
        jobs = [(None, a, None, seed) for seed in turn_credit.REPORT_SEEDS for a in arms]
        assert rc.plan_minutes(jobs, 4, cpu) / 2 <= 60, arms
    for arms in rc.TUNE_GROUPS:
        jobs = [j for j in tune if j[1] in arms]
        assert rc.plan_minutes(jobs, 4, cpu) / 2 <= 60, arms


@pytest.mark.slow
def test_smoke_run_end_to_end_and_resume(tmp_path, capsys):
    argv = ["--size", "smoke", "--arms", "step", "--seeds", "1", "--output_dir", str(tmp_path)]
    assert rc.main(argv) == 0
    # ppo, the baseline, is read also when a command runs another arm: none finished yet
    assert "no finished ppo runs" in capsys.readouterr().out
    run = rc.run_dir(tmp_path, 4, "step", Setting(0.95, 1e-4), 1)
    ev = json.loads((run / "eval.json").read_text())
    assert 0 <= ev["T1"]["gold"] <= 1 and ev["T1"]["gold"] == ev["T1"]["accuracy"]
    assert ev["T1"]["tokens_mean"] > 40 and ev["cpu_s_stage"] > 0 and ev["cpu_s_held_out"] > 0
    assert "--termination_condition step" in ev["command"]
    argv[3] = "ppo,step"
    assert rc.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("done already") == 1
    assert "| ppo | λ=0.95, lr=1e-04 | 1 |" in out and "| step | λ=0.95, lr=1e-04 | 1 |" in out
