"""The runs of marlhf compare (marlhf/pipeline/runs.py): rows and values left out with a warning
naming file and line, runs given twice, empty or stopped seeds, arms of different settings, and
labels of shell-expanded globs."""

from __future__ import annotations

import json

import pytest

from marlhf.cli import config_to_dict
from marlhf.macro.config import MacroConfig
from marlhf.pipeline.runs import arms_of, read_series
from marlhf.stages.ppo.config import PPOStageConfig


def _write(path, lines: list[str], newline_at_end: bool = True):
    path.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + ("\n" if newline_at_end else "")
    (path / "metrics.jsonl").write_text(text)
    return path


def _rows(golds, start=1) -> list[str]:
    return [json.dumps({"step": s, "objective/gold": g}) for s, g in enumerate(golds, start)]


def _ppo(path, golds, seed=1234, **macro):
    _write(path, _rows(golds))
    cfg = PPOStageConfig(macro=MacroConfig(**macro))
    cfg.ppo.optim.seed = seed
    (path / "run_config.json").write_text(json.dumps(config_to_dict(cfg)))
    return path


def _collect():
    notes: list[str] = []
    return notes, notes.append


def test_bad_rows_and_values_are_left_out_by_line(tmp_path):
    lines = [
        json.dumps({"step": 1, "objective/gold": 0.5, "other": "text"}),
        "garbage {",
        json.dumps({"objective/gold": 0.7}),  # no step
        json.dumps({"step": "3", "objective/gold": 0.7}),  # step as a string
        json.dumps({"step": 4, "objective/gold": "0.9", "objective/kl": 0.1}),
        '{"step": 5, "objective/gold": NaN, "objective/kl": Infinity}',
        json.dumps({"step": 6, "objective/gold": None, "objective/kl": 0.2}),
        json.dumps({"step": 7, "objective/gold": 1.5}),
        '{"step": 8, "objective/go',  # half-written: a run still going
    ]
    f = _write(tmp_path / "r", lines, newline_at_end=False) / "metrics.jsonl"
    notes, warn = _collect()
    series = read_series(f, {"objective/gold", "objective/kl"}, warn)
    assert series == {"objective/gold": {1: 0.5, 7: 1.5}, "objective/kl": {4: 0.1, 6: 0.2}}
    text = "\n".join(notes)
    assert f"{f} line 2: not JSON; left out" in text
    assert f'{f} lines 3, 4: no integer "step"; left out' in text
    assert f"{f} line 4: objective/gold not a number; left out" not in text  # the row is out
    assert f"{f} line 5: objective/gold not a number; left out" in text
    assert f"{f} lines 6, 7: objective/gold non-finite (NaN, inf or null); left out" in text
    assert f"{f} line 6: objective/kl non-finite" in text
    assert f"{f} line 9: a half-written last line (a run still going?); left out" in text
    assert "other" not in text  # a metric that is not reported is not warned about


def test_a_complete_last_row_without_newline_counts(tmp_path):
    f = _write(tmp_path / "r", _rows([0.1, 0.2, 0.3]), newline_at_end=False) / "metrics.jsonl"
    notes, warn = _collect()
    assert read_series(f, {"objective/gold"}, warn) == {"objective/gold": {1: 0.1, 2: 0.2, 3: 0.3}}
    assert notes == []


def test_a_directory_given_twice_counts_once(tmp_path):
    run = _write(tmp_path / "s1", _rows([0.1, 0.2]))
    notes, warn = _collect()
    arms = arms_of([str(run), str(tmp_path / "s*"), str(tmp_path / "." / "s1")], [], warn=warn)
    assert [len(v) for v in arms.values()] == [1]
    assert sum("given twice" in n for n in notes) == 2


def test_empty_seeds_are_left_out_and_stopped_seeds_named(tmp_path):
    _write(tmp_path / "a_s1", _rows([0.1, 0.2, 0.3, 0.4]))
    _write(tmp_path / "a_s2", _rows([0.2, 0.3, 0.4, 0.5]))
    _write(tmp_path / "a_s3", [])  # started, nothing logged yet
    _write(tmp_path / "a_s4", _rows([0.2, 0.3]))  # crashed at step 2
    notes, warn = _collect()
    arms = arms_of([str(tmp_path / "a_s*")], ["A"], {"objective/gold"}, warn)
    assert [r.path.name for r in arms["A"]] == ["a_s1", "a_s2", "a_s4"]
    text = "\n".join(notes)
    assert f"{tmp_path / 'a_s3' / 'metrics.jsonl'}: no complete row; the run is left out" in text
    assert f"{tmp_path / 'a_s4'} logged up to step 2, another seed up to step 4" in text
    assert "a_s1 logged" not in text and "a_s2 logged" not in text


def test_one_label_over_runs_of_different_settings_is_warned(tmp_path):
    _ppo(tmp_path / "x_s1", [0.1, 0.2], seed=1, ngram=5)
    _ppo(tmp_path / "x_s2", [0.1, 0.2], seed=2, ngram=3)
    notes, warn = _collect()
    arms = arms_of([str(tmp_path / "x_s*")], ["MA-PPO"], warn=warn)
    assert [len(v) for v in arms.values()] == [2]
    assert any("arm MA-PPO pools runs of different settings" in n and "ngram: 5, 3" in n
               for n in notes)  # fmt: skip


def test_without_labels_runs_of_different_settings_are_separate_arms(tmp_path):
    for seed in (1, 2):
        _ppo(tmp_path / f"lr1_s{seed}", [0.1, 0.2], seed=seed, ngram=5)
    cfg = PPOStageConfig(macro=MacroConfig(ngram=5))
    cfg.models.actor.optim.learning_rate = 2e-5
    _write(tmp_path / "lr2_s1", _rows([0.1, 0.2]))
    (tmp_path / "lr2_s1" / "run_config.json").write_text(json.dumps(config_to_dict(cfg)))
    notes, warn = _collect()
    arms = arms_of([str(tmp_path / "lr*")], [], warn=warn)
    default = PPOStageConfig().models.actor.optim.learning_rate
    assert {k: len(v) for k, v in arms.items()} == {
        f"MA-PPO n=5, actor_learning_rate={default}": 2,
        "MA-PPO n=5, actor_learning_rate=2e-05": 1,
    }
    assert notes == []


@pytest.fixture
def two_kinds(tmp_path):
    """Three PPO seeds and two MA-PPO n=5 seeds, interleaved by name."""
    for s in (1, 2, 3):
        _ppo(tmp_path / f"ppo_s{s}", [0.1, 0.2 + s], seed=s, ngram=1)
    for s in (1, 2):
        _ppo(tmp_path / f"mappo_s{s}", [0.3, 0.4 + s], seed=s, ngram=5)
    return tmp_path


def test_labels_of_shell_expanded_globs_name_the_arms(two_kinds):
    # what the shell makes of `out/ppo_s* out/mappo_s*`
    runs = [str(two_kinds / f"ppo_s{s}") for s in (1, 2, 3)]
    runs += [str(two_kinds / f"mappo_s{s}") for s in (1, 2)]
    arms = arms_of(runs, ["PPO", "MA-PPO n=5 (lr 1e-5)"])
    assert {k: [r.path.name for r in v] for k, v in arms.items()} == {
        "PPO": ["ppo_s1", "ppo_s2", "ppo_s3"],
        "MA-PPO n=5 (lr 1e-5)": ["mappo_s1", "mappo_s2"],
    }
    # one label per RUN argument still names each argument
    arms = arms_of([str(two_kinds / "ppo_s*"), str(two_kinds / "mappo_s1")], ["a", "b"])
    assert [len(v) for v in arms.values()] == [3, 1]


def test_labels_that_fit_neither_say_to_quote(tmp_path):
    for s in (1, 2, 3):
        _write(tmp_path / f"ppo_s{s}", _rows([0.1]))  # no run_config.json: named by directory
    with pytest.raises(
        ValueError, match=r"2 labels for 3 RUN arguments, which make 3 arms .*quote"
    ):
        arms_of([str(tmp_path / f"ppo_s{s}") for s in (1, 2, 3)], ["A", "B"])


def test_one_seed_run_twice_is_warned(tmp_path):
    _ppo(tmp_path / "a_s1", [0.1, 0.2], seed=1)
    _ppo(tmp_path / "a_s2", [0.1, 0.2], seed=1)  # a copy, or the seed flag forgotten
    _ppo(tmp_path / "a_s3", [0.1, 0.3], seed=3)
    notes, warn = _collect()
    arms = arms_of([str(tmp_path / "a_s*")], ["A"], warn=warn)
    assert len(arms["A"]) == 3
    a1, a2 = tmp_path / "a_s1", tmp_path / "a_s2"
    assert notes == [
        f"arm A: {a1} and {a2} ran the same settings and seeds (seed=1, data_seed=None): "
        "one seed twice, not two seeds"
    ]
