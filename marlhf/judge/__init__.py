"""Pairwise evaluation: LLM judge (prompts, strict parsing, reply cache, async client, statistics),
result-file pairing, blind human evaluation and evaluation-set sampling.

Modules: :mod:`~marlhf.judge.prompts`, :mod:`~marlhf.judge.parse`, :mod:`~marlhf.judge.cache`,
:mod:`~marlhf.judge.client`, :mod:`~marlhf.judge.outcomes`, :mod:`~marlhf.judge.pairing`,
:mod:`~marlhf.judge.run` (the judge pipeline: :mod:`~marlhf.judge.config`, :mod:`~marlhf.judge.cost`,
:mod:`~marlhf.judge.collect`, :mod:`~marlhf.judge.report`), :mod:`~marlhf.judge.human` (terminal tool) and
:mod:`~marlhf.judge.sampling`. Nothing heavy is imported here; ``openai`` only when a request is sent.
"""
