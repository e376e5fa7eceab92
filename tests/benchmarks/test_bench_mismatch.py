"""The mismatch benchmark (benchmarks/bench_mismatch.py) measures through the GPU acceptance run's
probe (`marlhf.gpu_check.probes.rollout_mismatch`): on tiny sizes its figures per dtype are the
probe's, fp32 at float rounding and bf16 at bf16's."""

import torch

from benchmarks import bench_mismatch as bench
from marlhf.gpu_check.probes import rollout_mismatch

SIZES = ["--hidden", "64", "--layers", "1", "--vocab", "256", "--batch", "2", "--prompt", "4"]


def test_bench_mismatch_reports_the_probe():
    res = bench.main([*SIZES, "--new-tokens", "8", "--ngram", "3", "--device", "cpu"])
    assert res["fp32"]["rollout/logprob_diff_max"] < 1e-4
    assert res["fp32"]["tis_weight_min"] > 0.999 and res["fp32"]["tokens"] == 16
    assert res["bf16"]["dtype"] == "torch.bfloat16"
    model = bench.build_gemma(64, 1, 256, torch.float32, torch.device("cpu"))
    probe = rollout_mismatch(model, 2, 4, 8, ngram=3)
    for key in ("rollout/logprob_diff_mean", "rollout/ratio_max_macro", "gspo_outside_clip"):
        assert res["fp32"][key] == probe[key], key
