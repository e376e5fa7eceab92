"""Stage 1: supervised fine-tuning (``python -m marlhf.stages.sft``).

The stage's skeleton, as every stage's: :mod:`~marlhf.stages.sft.config` (the flags, no torch),
:mod:`~marlhf.stages.sft.train` (the loss, the evaluation, the saved model and ``main``) and
``__main__``. Importing the package imports no torch: ``SFTConfig`` comes from the config module and
``main`` (``marlhf.stages.sft:main``) from the training module when it is first asked for.
"""

from __future__ import annotations

from marlhf.plugins import lazy_attributes
from marlhf.stages.sft.config import SFTConfig

__all__ = ["SFTConfig", "main"]
__getattr__ = lazy_attributes(__name__, {"main": "marlhf.stages.sft.train"}, globals())
