"""For tests/runtime/test_teardown.py: a stage process (:func:`marlhf.stages.exits.run_program`
around :func:`marlhf.stages.common.run_stage`, a world of one on gloo) that ends as the first
argument says: ``ok``, or ``error`` (a data error, status 2); with ``kept``, a process group that
outlives the stage's teardown (a module global, as a library may keep one). An exit handler
writes the process group's threads at exit to the JSON file given as the second argument; the
output's last line is printed without a newline, left in the buffer; the interpreter's
finalization, when it runs, writes ``interpreter finalized`` to stderr."""

import atexit
import json
import sys

import torch

_KEPT = []


class _Finalized:
    """Says so when the interpreter's finalization clears this module."""

    def __del__(self) -> None:
        sys.stderr.write("interpreter finalized\n")


_FINALIZED = _Finalized()


def main() -> None:
    from marlhf.data.schema import DataError
    from marlhf.runtime.distributed import init_distributed, process_group_threads
    from marlhf.stages.common import run_stage
    from marlhf.stages.exits import run_program

    end, out = sys.argv[1], sys.argv[2]
    atexit.register(lambda: open(out, "w").write(json.dumps(process_group_threads())))

    def train(cfg) -> None:
        init_distributed()
        if "kept" in end:
            _KEPT.append(torch.distributed.new_group([0]))
        print("trained", end="")
        if "error" in end:
            raise DataError('data/train.jsonl line 7: field "chosen" is empty')

    run_program(lambda: run_stage(train, None))


if __name__ == "__main__":
    main()
