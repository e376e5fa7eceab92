"""Sample the evaluation subset (default 50 prompts) of an inference result file.

    python evaluation/tools/sample_from_dataset.py --data-path results/m.jsonl \
        --save-path results/m-sampled.jsonl --dataset summarize [--num 50] [--seed 42]

The choice depends only on the prompts and the seed, so two models' files give the same prompts.
See ``marlhf/judge/sampling.py``.
"""

import sys
from pathlib import Path

try:
    import marlhf  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from marlhf.judge.sampling import main

if __name__ == "__main__":
    sys.exit(main())
