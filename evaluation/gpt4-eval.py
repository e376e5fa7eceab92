"""Pairwise LLM-judge evaluation of two result files (TL;DR summarisation, HH-RLHF dialogue).

    python evaluation/gpt4-eval.py --model_name_a A.jsonl --model_name_b B.jsonl \
        --dataset summarize --output a-vs-b.jsonl

``--dataset``: summarize (alias tldr), hh-rlhf (alias hh), webgpt, synthetic. The key comes from
OPENAI_API_KEY (``--sk`` also accepted). Exit status: 0 done, 2 bad input, 1 when no pair got a
verdict (every request failed, or no reply parsed). See ``marlhf/judge/run.py``.
"""

import sys
from pathlib import Path

try:
    import marlhf  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from marlhf.judge.run import main

if __name__ == "__main__":
    sys.exit(main())
