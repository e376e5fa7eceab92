"""Tests for marlhf.rewards.code: APPS test parsing, execution scoring, rewards, pass@k."""

import doctest
import itertools
import json
import math
import time
from fractions import Fraction

import pytest

import marlhf.rewards.code as cr
from marlhf.rewards.code import (
    CodeResult,
    CodeRewardConfig,
    CodeRewarder,
    TestSuite,
    batched_pass_at_k,
    code_reward,
    code_stats,
    extract_code,
    parse_tests,
    pass_at_k,
    return_matches,
    run_tests,
    stdout_matches,
)

T = 2.0

ADD_SUITE = parse_tests(
    json.dumps({"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7\n", "0\n"]})
)
ADD_OK = "a, b = map(int, input().split())\nprint(a + b)"


def test_docstring_examples():
    assert doctest.testmod(cr).failed == 0


# ---------------------------------------------------------------- parsing


def test_parse_tests_stdin_and_call_based():
    s = parse_tests('{"inputs": ["1\\n"], "outputs": ["2\\n"]}')
    assert s == TestSuite(("1\n",), ("2\n",), None)
    c = parse_tests({"inputs": [[1, 2]], "outputs": [3], "fn_name": "add"})
    assert c.fn_name == "add" and c.inputs == ([1, 2],) and len(c) == 1


@pytest.mark.parametrize(
    "raw, msg",
    [
        ("{not json", "not valid JSON"),
        ('{"outputs": []}', '"inputs" missing'),
        ('{"inputs": [], "outputs": "x"}', '"outputs" must be a list'),
        ('{"inputs": ["1"], "outputs": []}', "1 inputs but 0 outputs"),
        ('{"inputs": [], "outputs": [], "fn_name": "a b"}', '"fn_name"'),
        ("[1, 2]", "JSON object"),
    ],
)
def test_parse_tests_errors_name_the_field(raw, msg):
    with pytest.raises(ValueError, match=msg):
        parse_tests(raw)


# ---------------------------------------------------------------- comparison rules


@pytest.mark.parametrize(
    "got, expected, ok",
    [
        ("3\n", "3\n", True),
        ("3", "3\n\n", True),  # trailing newlines
        ("1 2  \r\n3\n", "1 2\n3", True),  # trailing spaces, CRLF
        ("1 2 3", ["1 2", "3"], True),  # expected given as a list of lines
        ("0.3333333", "0.333333333", True),  # float tolerance
        ("0.34", "0.33", False),
        ("YES", "yes", False),  # case matters
        ("1 2", "1 2 3", False),
        ("", "", True),
    ],
)
def test_stdout_matches(got, expected, ok):
    assert stdout_matches(got, expected) is ok


@pytest.mark.parametrize(
    "got, expected, ok",
    [
        (3, 3, True),
        ([1, 2], [1, 2], True),
        ([1, 2], [[1, 2]], True),  # APPS wraps the expected value in a list
        (5, [5], True),
        (0.1 + 0.2, 0.3, True),
        (True, 1, False),
        ("a", "a", True),
        ([1, 2], [2, 1], False),
        ({"a": 1}, {"a": 1}, True),
    ],
)
def test_return_matches(got, expected, ok):
    assert return_matches(got, expected) is ok


# ---------------------------------------------------------------- running programs


def test_stdin_program_all_pass():
    r = run_tests(ADD_OK, ADD_SUITE, timeout_s=T)
    assert r == CodeResult(3, 3, ("pass",) * 3, False, False, False)
    assert (
        code_reward(r) == 1.0
        and code_reward(r, "ppocoder") == 1.0
        and code_reward(r, "coderl") == 1.0
    )


def test_partially_correct_program():
    src = "a, b = map(int, input().split())\nprint(a + b if a > 0 else 99)"
    r = run_tests(src, ADD_SUITE, timeout_s=T)
    assert r.statuses == ("pass", "pass", "wrong_answer")
    assert code_reward(r) == pytest.approx(2 / 3)
    assert code_reward(r, "ppocoder") == pytest.approx(2 / 3)
    assert code_reward(r, "coderl") == cr.WRONG_ANSWER_PENALTY


def test_call_based_plain_function():
    suite = parse_tests(
        {"inputs": [[[1, 2, 3]], [[]], [[5]]], "outputs": [[6], 0, 5], "fn_name": "total"}
    )
    r = run_tests("def total(xs):\n    return sum(xs)", suite, timeout_s=T)
    assert r.passed == 3 and r.total == 3


def test_call_based_class_solution_with_tuple_and_prints():
    suite = parse_tests(
        {"inputs": [[3, 1], [2, 5]], "outputs": [[[1, 3]], [2, 5]], "fn_name": "sortPair"}
    )
    src = (
        "class Solution:\n"
        "    def sortPair(self, a, b):\n"
        "        print('debug output is ignored')\n"
        "        return tuple(sorted((a, b)))\n"
    )
    r = run_tests(src, suite, timeout_s=T)
    assert r.statuses == ("pass", "pass")


def test_call_based_wrong_and_missing_function():
    suite = parse_tests({"inputs": [[2]], "outputs": [4], "fn_name": "double"})
    assert run_tests("def double(x):\n    return x + 1", suite, timeout_s=T).statuses == (
        "wrong_answer",
    )
    missing = run_tests("def triple(x):\n    return 3 * x", suite, timeout_s=T)
    assert missing.statuses == ("runtime_error",) and missing.runtime_error


def test_compile_error_scores():
    r = run_tests("def f(:\n", ADD_SUITE, timeout_s=T)
    assert r.compile_error and r.passed == 0 and r.total == 3
    assert code_reward(r) == 0.0
    assert code_reward(r, "ppocoder") == -1.0 and code_reward(r, "coderl") == -1.0


def test_runtime_error_scores():
    src = "a, b = map(int, input().split())\nprint(a + b if a else 1 // 0)"
    r = run_tests(src, ADD_SUITE, timeout_s=T)
    assert r.statuses == ("pass", "pass", "runtime_error") and r.runtime_error
    assert code_reward(r) == pytest.approx(2 / 3)
    assert code_reward(r, "ppocoder") == -0.6 and code_reward(r, "coderl") == -0.6


@pytest.mark.parametrize(
    "src, status",
    [
        ("while True:\n    pass", "timeout"),
        ("import os\nwhile True:\n    os.fork()", "blocked"),
        ("import subprocess\nsubprocess.run(['sh', '-c', 'echo 3'])", "blocked"),
        ("x = bytearray(8 * 1024**3)", "memory"),
    ],
)
def test_hostile_programs_score_as_failures(src, status):
    suite = TestSuite(("1 2\n",), ("3\n",))
    r = run_tests(src, suite, timeout_s=1.0, memory_mb=256)
    assert r.statuses == (status,) and r.passed == 0
    assert code_reward(r) == 0.0
    assert code_reward(r, "ppocoder") == -0.6


def test_blocked_but_correct_output_still_fails():
    # prints the right answer but also tried to fork: any sandbox violation fails the test
    src = "import os\ntry:\n    os.fork()\nexcept Exception:\n    pass\nprint(3)"
    r = run_tests(src, TestSuite(("1 2\n",), ("3\n",)), timeout_s=T)
    assert r.statuses == ("blocked",)


def test_max_tests_and_stop_on_first_failure():
    r = run_tests(ADD_OK, ADD_SUITE, timeout_s=T, max_tests=2)
    assert (r.passed, r.total) == (2, 2)
    wrong = "print(0)"
    r = run_tests(wrong, ADD_SUITE, timeout_s=T, stop_on_first_failure=True)
    assert r.statuses == ("wrong_answer", "skipped", "skipped") and r.total == 3


def test_budget_bounds_a_looping_program():
    suite = TestSuite(("",) * 6, ("x",) * 6)
    t0 = time.monotonic()
    r = run_tests("while True:\n    pass", suite, timeout_s=1.0, budget_s=1.5)
    elapsed = time.monotonic() - t0
    assert elapsed < 2.5
    assert r.statuses[:2] == ("timeout", "timeout") and set(r.statuses[2:]) == {"skipped"}
    assert r.timeout and r.passed == 0


def test_empty_suite():
    r = run_tests(ADD_OK, TestSuite((), ()), timeout_s=T)
    assert (r.passed, r.total) == (0, 0) and code_reward(r) == 0.0


def test_integers_beyond_the_int_str_digit_limit():
    # APPS tests hold 9000+ digit numbers; Python refuses int(str) / str(int) beyond 4300 digits
    big, twice = "7" * 5000, "1" + "5" * 4999 + "4"  # twice = 2 * big, by hand
    raw = '{"fn_name": "double", "inputs": [[' + big + "], [3]], "
    raw += '"outputs": [[' + twice + "], [6]]}"
    suite = parse_tests(raw)
    assert suite.inputs[0][0] % 10**6 == 777777 and suite.outputs[1] == [6]
    r = run_tests("def double(x):\n    return 2 * x", suite, timeout_s=T)
    assert (r.passed, r.total) == (2, 2)
    r = run_tests("def double(x):\n    return 2 * x + 1", suite, timeout_s=T)
    assert r.statuses == ("wrong_answer", "wrong_answer")
    # stdin: a number given as a JSON integer in a list of lines, read by the program as text
    suite = parse_tests('{"inputs": [[' + big + ']], "outputs": ["' + twice + '"]}')
    assert run_tests("print(2 * int(input()))", suite, timeout_s=T).passed == 1
    # unequal integers beyond float range compare as unequal instead of raising OverflowError
    assert not return_matches(10**400, 10**400 + 1)
    assert return_matches(10**400, [10**400])


def test_code_stats_by_hand():
    results = [
        CodeResult(3, 3, ("pass",) * 3, False, False, False),
        CodeResult(1, 4, ("pass", "wrong_answer", "runtime_error", "timeout"), False, True, True),
        CodeResult(0, 2, ("compile_error",) * 2, True, False, False),
        CodeResult(0, 0, (), False, False, False),
    ]
    rewards = [1.0, -0.6, -1.0, 0.0]
    assert code_stats(results, rewards) == pytest.approx(
        {
            "code/pass_rate": (1 + 1 / 4 + 0 + 0) / 4,
            "code/all_pass": 1 / 4,  # no tests is not "all pass"
            "code/compile_error": 1 / 4,
            "code/runtime_error": 1 / 4,
            "code/timeout": 1 / 4,
            "code/reward": -0.6 / 4,
        }
    )
    assert code_stats([], []) == {}
    with pytest.raises(ValueError, match="1 results but 2 rewards"):
        code_stats(results[:1], rewards[:2])


def test_unknown_scheme():
    with pytest.raises(ValueError, match="--code_reward_scheme"):
        code_reward(CodeResult(0, 1, ("pass",), False, False, False), "nope")


# ---------------------------------------------------------------- batch scoring


def test_rewarder_batch_is_concurrent_and_ordered():
    timeout = 1.0
    looping = "while True:\n    pass"
    programs = [looping if i % 2 else ADD_OK for i in range(8)]
    suites = [TestSuite(("1 2\n",), ("3\n",))] * 8
    t0 = time.monotonic()
    with CodeRewarder(2, timeout_s=timeout, budget_s=5.0) as rw:
        rewards = rw.rewards(programs, suites, extract=False)
    elapsed = time.monotonic() - t0
    assert rewards == [1.0, 0.0] * 4
    # sequentially the 4 loops alone take 4 s; 2 workers overlap them: ~2 s + start-ups
    assert elapsed < 0.5 * 8 * timeout


def test_rewarder_extracts_code_and_checks_lengths():
    response = "Sure:\n```python\n" + ADD_OK + "\n```\nThis adds."
    with CodeRewarder(1, timeout_s=T, scheme="ppocoder") as rw:
        assert rw.rewards([response], [ADD_SUITE]) == [1.0]
        rewards, results = rw.evaluate([response, "def f(:"], [ADD_SUITE, ADD_SUITE])
        assert rewards == [1.0, -1.0] and [r.compile_error for r in results] == [False, True]
        with pytest.raises(ValueError, match="2 programs but 1 test suites"):
            rw.score([ADD_OK, ADD_OK], [ADD_SUITE])


def test_rewarder_start_removes_dead_trainers_dirs_and_logs_the_layers(caplog):
    """A trainer killed while a program ran leaves its work dir: the next CodeRewarder removes it
    (its owner is dead) and states which sandbox layers hold."""
    import os
    import subprocess
    import tempfile

    import marlhf.rewards.sandbox.run as sb

    dead = subprocess.Popen(["sleep", "30"])
    start = sb._process_start_time(dead.pid)
    dead.kill()
    dead.wait()
    ns = os.stat("/proc/self/ns/pid").st_ino
    stale = tempfile.mkdtemp(prefix=f"marlhf-sandbox-{ns}-{dead.pid}-{start}-")
    with open(os.path.join(stale, "solution.py"), "w") as f:
        f.write("import time\ntime.sleep(100)\n")
    with caplog.at_level("INFO", logger="marlhf.rewards.code"), CodeRewarder(1, timeout_s=T) as rw:
        pass
    assert not os.path.exists(stale)
    assert rw.layers and "audit" in rw.layers
    assert any(
        "sandbox with" in r.getMessage() and ", ".join(rw.layers) in r.getMessage()
        for r in caplog.records
    )


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        ({"code_reward_scheme": "x"}, "--code_reward_scheme"),
        ({"code_workers": 0}, "--code_workers"),
        ({"code_timeout_s": 0}, "--code_timeout_s"),
        ({"code_memory_mb": 1}, "--code_memory_mb"),
        ({"code_budget_s": -1}, "--code_budget_s"),
        ({"code_max_tests": 0}, "--code_max_tests"),
    ],
)
def test_config_validation_names_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        CodeRewardConfig(**kwargs)


def test_config_builds_rewarder():
    rw = CodeRewarder.from_config(CodeRewardConfig(code_workers=1, code_max_tests=1))
    try:
        assert rw.max_tests == 1 and rw.scheme == "pass_fraction"
    finally:
        rw.close()


# ---------------------------------------------------------------- extract_code


@pytest.mark.parametrize(
    "response, code",
    [
        ("```python\nprint(1)\n```", "print(1)\n"),
        ("text\n```py\nx = 1\n```\nmore\n```python\ny = 2\n```", "x = 1\n"),
        ("```text\nnot code\n```\n```python3\nz = 3\n```", "z = 3\n"),
        ("```\nplain = 1\n```", "plain = 1\n"),
        ("```python\ncut = 1\nwhile", "cut = 1\nwhile"),  # generation truncated
        ("print('no fence')", "print('no fence')"),
    ],
)
def test_extract_code(response, code):
    assert extract_code(response) == code


# ---------------------------------------------------------------- pass@k


def _brute_pass_at_k(n: int, c: int, k: int) -> Fraction:
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    hits = sum(any(samples[i] for i in s) for s in subsets)
    return Fraction(hits, len(subsets))


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_matches_subset_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(_brute_pass_at_k(n, c, k)), abs=1e-12)


def test_pass_at_k_large_n_stable():
    n, c, k = 200, 13, 100
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c / n


def test_pass_at_k_invalid():
    for args in [(0, 0, 1), (5, 6, 1), (5, 1, 0), (5, 1, 6), (5, -1, 1)]:
        with pytest.raises(ValueError, match="pass_at_k"):
            pass_at_k(*args)


def test_batched_pass_at_k():
    assert batched_pass_at_k(5, [0, 5, 1], 1) == pytest.approx([0.0, 1.0, 0.2])
    assert batched_pass_at_k([4, 10], [2, 0], 2) == pytest.approx(
        [float(_brute_pass_at_k(4, 2, 2)), 0.0]
    )
    with pytest.raises(ValueError, match="2 sample counts but 3"):
        batched_pass_at_k([4, 10], [1, 2, 3], 1)
