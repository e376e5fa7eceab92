"""The multi-turn sampling benchmark (benchmarks/bench_multiturn.py) runs end to end on a tiny
setting: every way samples the same number of action tokens (its own asserts), and continuing a
conversation reads fewer prompt tokens than re-reading it."""

from benchmarks import bench_multiturn as bench


def test_bench_multiturn_smoke():
    res = bench.main(["--batch", "2", "--turns", "3", "--action_tokens", "2", "--repeats", "1"])
    r = res["static_k3"]
    assert res["prompt_tokens"] == 30 and res["context_tokens"] > 0
    # 2 rows: the prompts, then per turn the last action token and the context
    assert r["continue_prompt_tokens"] == 2 * 30 + 2 * 2 * (1 + res["context_tokens"])
    assert r["reread_prompt_tokens"] > r["continue_prompt_tokens"] > r["single_prompt_tokens"]
    assert r["single_all_tokens_prompt_tokens"] == 2 * (30 + 2 * res["context_tokens"])
    assert all(r[k] > 0 for k in ("continue_s", "reread_s", "single_s", "single_all_tokens_s"))


def test_bench_multiturn_with_environment_steps():
    """Through the episode runner on an environment whose steps take 5 ms, without and with
    overlap: both ways read what continuing reads (the same tokens), and their ratios are there."""
    argv = ["--batch", "3", "--turns", "2", "--action_tokens", "2", "--repeats", "1"]
    res = bench.main([*argv, "--env_step_ms", "5", "--overlap", "2"])
    r = res["static_k2"]
    assert r["env_prompt_tokens"] == r["env_overlap_prompt_tokens"] == r["continue_prompt_tokens"]
    assert all(r[k] > 0 for k in ("env_s", "env_overlap_s", "env_overlap_over_env"))
    assert res["env_step_ms"] == 5.0 and res["overlap"] == 2
