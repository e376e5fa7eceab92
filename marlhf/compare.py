"""``python -m marlhf.compare RUN...``: compare runs (curves, final values, steps to a target) and
paired result files; forwards to :mod:`marlhf.pipeline.compare`, where it lives."""

import sys

from marlhf.pipeline.compare import main

if __name__ == "__main__":
    sys.exit(main())
