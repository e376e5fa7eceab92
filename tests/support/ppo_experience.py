"""Steps 3–4 of a PPO step on one process, composed of the loop's own functions in the loop's order
(`marlhf.stages.ppo.loop.ppo_step`): make_experience, gather_experience (the identity on one
process), estimate."""

from __future__ import annotations

from marlhf.stages.ppo.experience import estimate, gather_experience, make_experience


def loop_experience(rule, ro, scored, scores, cfg, kl_coef, **kwargs):
    """The gathered and estimated experience of ``ro`` as the loop makes it (``kwargs``: the
    ``row_seeds``, ``dense`` and ``all_gather`` of :func:`make_experience`)."""
    term, exp = make_experience(rule, ro, scored, scores, cfg.ppo, kl_coef, **kwargs)
    exp = gather_experience(exp, pad_id=0, block=len(ro.prompt_ids))
    return estimate(exp, term, cfg.ppo, cfg.macro)
