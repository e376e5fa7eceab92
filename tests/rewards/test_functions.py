"""Tests for marlhf.rewards.functions: loading ``--reward_fn`` functions, calling them with the
rows' columns (sync and async), and what happens when they misbehave."""

import textwrap

import pytest
import torch

from marlhf.rewards.config import RewardConfig
from marlhf.rewards.functions import FunctionRewards, load_reward_function, reward_functions
from marlhf.rewards.sources import check_columns, custom_rewards
from marlhf.rewards.terms import RewardBatch, RewardError, combine

USER_FILE = """
import asyncio

def exact(prompts, completions, answer, **columns):
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

def named_only(prompts, completions, answer):
    return [float(len(a)) for a in answer]

def needs_difficulty(prompts, completions, difficulty):
    return [float(d) for d in difficulty]

def maybe(prompts, completions, **columns):
    return [None if c == "" else 0.5 for c in completions]

async def slow_length(prompts, completions, **columns):
    await asyncio.sleep(0.01)
    return [len(c) / 10 for c in completions]

def nan_on_second(prompts, completions, **columns):
    return [0.0, float("nan")] + [0.0] * (len(completions) - 2)

def broken(prompts, completions, **columns):
    raise KeyError("solution")

def wrong_length(prompts, completions, **columns):
    return [1.0]

NOT_A_FUNCTION = 3
"""


@pytest.fixture()
def user_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(textwrap.dedent(USER_FILE))
    return path


def _batch(completions=("4", "6", "9"), answers=("4", "6", "8")):
    n = len(completions)
    return RewardBatch(
        prompts=[f"q{i}" for i in range(n)],
        completions=list(completions),
        metas=[{"columns": {"answer": a, "id_text": f"r{i}"}} for i, a in enumerate(answers)],
    )


def _score(specs, batch, weights=(), errors="raise"):
    fns = reward_functions([str(s) for s in specs], weights)
    terms = FunctionRewards(fns, errors)(batch)
    return combine(terms, batch, torch.device("cpu"), errors)


def test_a_known_function_gets_the_rows_columns_and_its_values_add_up(user_file):
    batch = _batch()
    scores, metrics = _score([f"{user_file}:exact", f"{user_file}:slow_length"], batch, (2.0, 1.0))
    # exact: 1, 1, 0 (the answers are 4, 6, 8); slow_length: len / 10 = 0.1 each
    assert scores.tolist() == pytest.approx([2.1, 2.1, 0.1])
    assert metrics["reward/exact"] == pytest.approx(2 / 3)
    assert metrics["reward/slow_length"] == pytest.approx(0.1)


def test_a_function_without_kwargs_gets_only_the_columns_it_names(user_file):
    scores, metrics = _score([f"{user_file}:named_only"], _batch(answers=("4", "16", "256")))
    assert scores.tolist() == [1.0, 2.0, 3.0]


def test_none_leaves_the_row_to_the_other_rewards(user_file):
    batch = _batch(completions=("4", "", "8"))
    scores, metrics = _score([f"{user_file}:maybe", f"{user_file}:exact"], batch)
    assert scores.tolist() == [1.5, 0.0, 1.5]  # exact: 1, 0, 1; maybe: 0.5, None, 0.5
    assert metrics["reward/maybe"] == 0.5 and metrics["reward/maybe/scored"] == pytest.approx(2 / 3)
    with pytest.raises(RewardError, match="row 1 of the batch .*no reward scored it"):
        _score([f"{user_file}:maybe"], batch)


def test_modules_load_by_name(tmp_path, monkeypatch):
    (tmp_path / "rewards_pkg_for_test.py").write_text(
        "def one(p, c, **k):\n    return [1] * len(c)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = load_reward_function("rewards_pkg_for_test:one")
    assert fn(["a"], ["b"]) == [1]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("{dir}/nowhere.py:f", "nowhere.py does not exist"),
        ("{file}:missing", r"has no 'missing' \(its functions: broken, exact"),
        ("{file}:NOT_A_FUNCTION", "is a int, not a function"),
        ("no_such_module_xyz:f", "no module 'no_such_module_xyz'"),
    ],
)
def test_a_function_that_is_not_there_is_named(user_file, spec, match):
    spec = spec.format(dir=user_file.parent, file=user_file)
    with pytest.raises(ValueError, match=match) as e:
        load_reward_function(spec)
    assert str(e.value).startswith(f"--reward_fn {spec}")


def test_a_file_that_raises_on_import_is_named(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import no_such_package_xyz\n")
    with pytest.raises(ValueError, match=r"--reward_fn .*bad.py:f: loading .* ModuleNotFoundError"):
        load_reward_function(f"{bad}:f")


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("nan_on_second", r"nan_on_second, row 1 of the batch \(prompt 'q1'\): returned nan"),
        ("broken", r"broken raised KeyError: 'solution' \(on the batch of 3 rows"),
        ("wrong_length", "wrong_length returned 1 values for a batch of 3 rows"),
    ],
)
def test_a_misbehaving_function_stops_with_its_name_row_and_value_or_counts_as_zero(
    user_file, name, match
):
    with pytest.raises(RewardError, match=match):
        _score([f"{user_file}:{name}"], _batch())
    scores, metrics = _score([f"{user_file}:{name}", f"{user_file}:exact"], _batch(), errors="zero")
    assert scores.tolist() == [1.0, 1.0, 0.0]  # exact's rewards, the bad values 0
    assert metrics["reward/errors"] == (1 if name == "nan_on_second" else 3)


def test_required_columns_are_checked_against_the_prompts(user_file):
    custom = custom_rewards(RewardConfig(reward_fn=(f"{user_file}:needs_difficulty",)))
    metas = ['{"columns": {"answer": "4"}}', "{}"]
    with pytest.raises(ValueError, match=r"needs_difficulty takes the column\(s\) difficulty, .* "
                       r"\(their columns: answer\)"):  # fmt: skip
        check_columns(custom, metas)
    check_columns(custom, ['{"columns": {"difficulty": 3}}'])


def test_two_functions_of_one_name_are_told_apart(tmp_path, user_file):
    other = tmp_path / "other.py"
    other.write_text("def exact(p, c, **k):\n    return [0.0] * len(c)\n")
    fns = reward_functions([f"{user_file}:exact", f"{other}:exact"], ())
    assert [f.name for f in fns] == ["my_rewards.exact", "other.exact"]
