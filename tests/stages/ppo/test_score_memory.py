"""The chunked log-prob / entropy paths at a large vocabulary: the results of the
unchunked computation (within float32 rounding of a float64 reference), at a fraction of its peak
memory. Measured in a subprocess (`score_memory_probe.py`) whose large buffers glibc maps one by
one and returns when freed, so its peak resident set size follows the live tensors.

- `token_logprobs` + `entropy_from_logits` on (2, 64, 131072) float32 logits (64 MiB) in 4 MiB
  blocks at temperature 0.8: the unchunked `log_softmax(logits / T)` allocates about 3x the logits;
- a score pass (`policy_forward`, no grad) of a 1-layer, hidden-16 Llama with a 131072-token
  vocabulary over 8 rows of 96 tokens: the default path (LM head at the 64 response positions,
  rows scored in chunks of at most 2^22 logits) against the reference path, whose (B, T, V)
  float32 logits alone are 384 MiB.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parents[2] / "support" / "score_memory_probe.py"
pytestmark = pytest.mark.slow  # a subprocess
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def probe() -> dict:
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("peak RSS can be reset on Linux only")
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536")
    env.update(MALLOC_TRIM_THRESHOLD_="0", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, str(PROBE)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_chunked_logprobs_and_entropy_equal_the_unchunked_at_a_fraction_of_the_memory(probe):
    f = probe["function"]
    # the measurement sees the unchunked path's float32 temporaries (log_softmax, its exp, ...)
    assert f["unchunked_mb"] > 2 * f["logits_mb"], f
    # the chunked path: a few blocks of scratch, far below one copy of the logits
    assert f["chunked_mb"] < 10 * f["block_mb"] < f["logits_mb"], f
    assert f["chunked_mb"] < f["unchunked_mb"] / 5, f
    # as exact as the unchunked float32 computation (entropies reach log V = 11.8 nats)
    assert f["chunked_err"] < 2e-4 and f["chunked_err"] <= 2 * f["unchunked_err"] + 1e-5, f


def test_score_pass_stays_far_below_the_full_logits(probe):
    m = probe["model"]
    assert m["reference_mb"] > m["full_logits_mb"], m  # the reference holds the (B, T, V) logits
    assert m["fast_mb"] < 0.35 * m["full_logits_mb"], m
    assert m["max_diff"] < 1e-5, m
