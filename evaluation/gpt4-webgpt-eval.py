"""Pairwise LLM-judge evaluation of two WebGPT result files, per criterion (factual accuracy,
coherence, overall usefulness) and overall.

    python evaluation/gpt4-webgpt-eval.py --model_name_a A.jsonl --model_name_b B.jsonl \
        --output a-vs-b.jsonl

Always uses the ``webgpt`` template (the original README passed ``--dataset summarize`` here; it is
accepted, ignored, and a note says so). Exit status as ``gpt4-eval.py``. See ``marlhf/judge/run.py``.
"""

import sys
from pathlib import Path

try:
    import marlhf  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from marlhf.judge.run import main

if __name__ == "__main__":
    sys.exit(main(force_template="webgpt"))
