"""Stage 2: the reward model (``python -m marlhf.stages.reward``).

The stage's skeleton, as every stage's: :mod:`~marlhf.stages.reward.config` (the flags, no torch),
:mod:`~marlhf.stages.reward.train` (the Bradley–Terry step, the saved reward model and ``main``) and
``__main__``; the scores of a pair batch in :mod:`~marlhf.stages.reward.scorer`, the evaluation and
the normaliser's fit in :mod:`~marlhf.stages.reward.evaluate`. Importing the package imports none of
the modules.
"""
