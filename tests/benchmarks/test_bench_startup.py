"""benchmarks/bench_startup.py: reading the start-up line the stages log."""

import doctest

import benchmarks.bench_startup as bench


def test_doctests():
    assert doctest.testmod(bench).failed == 0


def test_parse_line_of_a_stage_log():
    text = "INFO marlhf.sft: start-up 6.1 s wall, 4.9 s CPU: imports 2.9/2.6, first step 3.2/2.3 (wall/CPU s)\n"
    assert bench.parse_line(text) == {"imports": (2.9, 2.6), "first step": (3.2, 2.3)}
    assert bench.parse_line("no line") == {}
