"""Blind pairwise human evaluation of two result files in the terminal.

    python evaluation/human-eval.py --model_name_a A.jsonl --model_name_b B.jsonl \
        --output human-a-vs-b.jsonl [--seed 42] [--num 50]

Keys: 1 = A, 2 = B, 3 = tie, 4 = skip, q = quit; re-running resumes. See ``marlhf/judge/human.py``.
"""

import sys
from pathlib import Path

try:
    import marlhf  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from marlhf.judge.human import main

if __name__ == "__main__":
    sys.exit(main())
