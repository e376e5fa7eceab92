"""Generate responses for validation prompts and score them with a reward model (MA-RLHF README,
"Inference"). All logic lives in :mod:`marlhf.inference`; see ``--help`` for the flags::

    python inference/inference_with_rewards.py --proj-path $PROJ_PATH --dataset summarize \
        --model $ACTOR --reward-model $RM --temperature 0.8 --gpu 0 --batch-size 16
"""

import sys
from pathlib import Path

try:
    import marlhf  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from marlhf.inference import main

if __name__ == "__main__":
    main()
