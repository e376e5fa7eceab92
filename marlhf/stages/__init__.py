"""The three training stages side by side: :mod:`~marlhf.stages.sft`, :mod:`~marlhf.stages.reward`
and :mod:`~marlhf.stages.ppo`, and what they share (:mod:`~marlhf.stages.common`)."""
