"""The decoding benchmark (benchmarks/bench_decode.py) runs end to end on tiny sizes."""

from benchmarks import bench_decode as bench


def test_bench_decode_smoke():
    """The benchmark script runs end to end on tiny sizes and reports both backends."""
    res = bench.main(
        [
            "--hidden",
            "32",
            "--layers",
            "1",
            "--vocab",
            "64",
            "--batch",
            "2",
            "--prompt",
            "4",
            "--new-tokens",
            "3",
            "--repeats",
            "1",
            "--device",
            "cpu",
            "--bandwidth",
            "1e10",
        ]
    )
    assert res["generate_tok_s"] > 0 and res["static_tok_s"] > 0
    assert res["bound_ms_per_step"] > 0
