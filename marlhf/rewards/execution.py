"""``--reward_source code``: the execution reward of each response against its prompt's test cases
(APPS), run in the sandbox by :class:`marlhf.rewards.code.CodeRewarder` (the ``--code_*`` flags);
prompts without tests are left out of the run. Declared in :mod:`marlhf.rewards.registry`.

>>> has_prompt_tests('{"input_output": {"inputs": ["1\\\\n"], "outputs": ["1\\\\n"]}}')
True
>>> has_prompt_tests("{}"), has_prompt_tests('{"input_output": "not json"}')
(False, False)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch

from marlhf.rewards.code import TestSuite, code_stats, parse_tests
from marlhf.rewards.registry import RewardContext
from marlhf.rewards.terms import RewardBatch, RewardTerm


def prompt_tests(meta: dict) -> TestSuite:
    """The test cases of a prompt's problem (its ``meta``: APPS ``tests`` / ``input_output``); an
    empty suite if none."""
    raw = meta.get("tests") or meta.get("input_output")
    return parse_tests(raw) if raw else TestSuite((), ())


def has_prompt_tests(meta: dict | str) -> bool:
    """Whether a prompt's ``meta`` (a dict, or its JSON) holds usable test cases."""
    try:
        return len(prompt_tests(json.loads(meta or "{}") if isinstance(meta, str) else meta)) > 0
    except ValueError:  # malformed tests: the problem cannot be scored
        return False


@dataclass(frozen=True)
class CodeExecution:
    """The execution reward (B,) of each response (its program:
    :func:`marlhf.rewards.code.extract_code`) against its prompt's tests, run by ``rewarder``
    (:class:`marlhf.rewards.code.CodeRewarder`); logs ``code/*``
    (:func:`marlhf.rewards.code.code_stats`)."""

    rewarder: Any

    def __call__(self, batch: RewardBatch) -> list[RewardTerm]:
        suites = [prompt_tests(m) for m in batch.metas]
        rewards, results = self.rewarder.evaluate(batch.completions, suites)
        values = torch.tensor(rewards, dtype=torch.float32)
        return [RewardTerm("code", values, metrics=code_stats(results, rewards), log_mean=False)]


def build_source(ctx: RewardContext) -> CodeExecution:
    """The ``code`` source of a run: the sandbox's ``ctx.rewarder``."""
    if ctx.rewarder is None:
        raise ValueError("--reward_source code needs the code rewarder (--code_* flags)")
    return CodeExecution(ctx.rewarder)
