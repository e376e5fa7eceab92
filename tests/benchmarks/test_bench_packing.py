"""A smoke run of benchmarks/bench_packing.py: every layout of a mix measured, the ratios taken."""

import pytest

from benchmarks import bench_packing

pytestmark = pytest.mark.slow


def test_a_tiny_run_measures_every_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("MARLHF_HOME", str(tmp_path / "home"))
    out = bench_packing.main(
        ["--rows", "4", "--steps", "1", "--rounds", "1", "--mixes", "half", "none",
         "--workdir", str(tmp_path)]
    )  # fmt: skip
    for mix, share in (("half", (0.4, 0.6)), ("none", (0.0, 0.0))):
        r = out["results"][mix]
        assert share[0] <= r["padding_share"] <= share[1]
        assert set(r["layouts"]) == set(bench_packing.LAYOUTS)
        for lay in r["layouts"].values():
            assert lay["step"] == pytest.approx(lay["generate"] + lay["score"] + lay["train"])
        ratio = r["ratios"]["padded/packed"]["score+train"]
        assert ratio["q1"] <= ratio["median"] <= ratio["q3"] and ratio["median"] > 0
