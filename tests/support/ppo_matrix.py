"""Train many short MA-PPO runs in one process (tests/stages/ppo/test_estimators.py).

``python tests/support/ppo_matrix.py CASES.json``: CASES.json maps a case name to its command line (the
flags of ``python -m marlhf.stages.ppo``); each case trains through ``marlhf.stages.ppo.loop.train`` in this
process (one DeepSpeed start-up for all of them) and writes its output directory as usual. A case that
raises is recorded in ``<CASES>.errors.json`` (name -> traceback) and the others go on.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

from marlhf.cli import parse_config
from marlhf.stages.ppo.config import PPOStageConfig
from marlhf.stages.ppo.loop import train


def main(path: str) -> None:
    cases = json.loads(Path(path).read_text())
    errors, times = {}, {}
    for name, argv in cases.items():
        t0 = time.perf_counter()
        try:
            train(parse_config(PPOStageConfig, argv))
        except Exception:  # noqa: BLE001 - reported per case by the test
            errors[name] = traceback.format_exc()
        times[name] = time.perf_counter() - t0
    Path(path + ".errors.json").write_text(json.dumps(errors, indent=1))
    Path(path + ".times.json").write_text(json.dumps(times, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
