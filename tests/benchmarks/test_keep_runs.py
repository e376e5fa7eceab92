"""benchmarks/keep_runs.py: the kept files of a finished run read as the run's own do, and restoring
them makes a comparison skip the run."""

import json
import math

from benchmarks import keep_runs as kr
from benchmarks.analysis import load_run


def _run(path, steps, finished=True):
    path.mkdir(parents=True)
    (path / "actor").mkdir()
    (path / "actor" / "model.safetensors").write_bytes(b"weights")
    rows = []
    for s in range(1, steps + 1):
        rows.append({"step": s, "objective/gold": s / 7, "time/step": 0.123456789 * s,
                     "policy/entropy": 1.0, "note": "not read"})  # fmt: skip
    # a resumed run logs step 2 again: the later row (the original's) wins
    rows.insert(1, {"step": 2, "objective/gold": -1.0, "time/step": 9.0})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        (path / "eval.json").write_text(json.dumps({"T1": {"gold": 0.5}, "greedy": {"gold": 0.75}}))


def test_kept_runs_read_as_the_originals_and_restore_skips_finished_ones(tmp_path):
    src, kept, out = tmp_path / "src", tmp_path / "kept", tmp_path / "out"
    _run(src / "arith4" / "ppo" / "lam1_lr1e-04" / "seed1", 5)
    _run(src / "arith4" / "step" / "lam1_lr1e-04" / "seed1", 4)
    _run(src / "arith4" / "step" / "lam1_lr1e-04" / "seed2", 3, finished=False)
    assert kr.main([str(src), str(kept)]) == 0
    files = sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file())
    assert files == [f"arith4/{arm}/lam1_lr1e-04/seed1/{name}"
                     for arm in ("ppo", "step") for name in ("eval.json", "metrics.jsonl")]  # fmt: skip
    for arm in ("ppo", "step"):
        rel = f"arith4/{arm}/lam1_lr1e-04/seed1"
        original, copy = (
            load_run(src / rel / "metrics.jsonl"),
            load_run(kept / rel / "metrics.jsonl"),
        )
        assert original.keys() == copy.keys()
        for key, values in original.items():
            for a, b in zip(values, copy[key], strict=True):
                assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-5), key
        assert copy["gold"][1] == 0.285714 and copy["step_time"][1] == 0.246914  # 6 digits
        assert (kept / rel / "eval.json").read_text() == (src / rel / "eval.json").read_text()
        rows = [json.loads(x) for x in (kept / rel / "metrics.jsonl").read_text().splitlines()]
        assert all("note" not in r and "policy/entropy" not in r for r in rows)
    # out holds step/seed1 finished already: only ppo's run is copied, step's is left as it is
    _run(out / "arith4" / "step" / "lam1_lr1e-04" / "seed1", 2)
    assert kr.restore_runs(kept, out) == [out / "arith4" / "ppo" / "lam1_lr1e-04" / "seed1"]
    assert load_run(out / "arith4" / "step" / "lam1_lr1e-04" / "seed1" / "metrics.jsonl")[
        "step"
    ] == [1, 2]
    assert kr.main([str(kept), str(out), "--restore"]) == 0  # nothing left to copy
