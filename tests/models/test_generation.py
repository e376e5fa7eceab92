"""The generation-backend registry (marlhf.models.generation): backends found by their module, the
flag's choices and help made from them in every program, ``auto``'s choice, and the one sampling
call (its masks against an independent loop). PPO's evaluation and ``marlhf infer`` on every backend:
``tests/stages/ppo/test_evaluation.py``, ``tests/inference/test_backends.py`` (vLLM:
``tests/with_vllm/``)."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

import marlhf.models.generation.backends as backends_package
from marlhf.cli import build_parser
from marlhf.inference import InferenceArgs
from marlhf.models.generation import (
    GenerationBackend,
    SamplerSetup,
    SamplingConfig,
    backend_names,
    get_backend,
    open_sampler,
    resolve_backend,
    sample_responses,
)
from marlhf.models.generation import registry as reg
from marlhf.stages.ppo.config import PPOStageConfig

# the backends whose evaluation and inference checks run in a suite of their own
OWN_SUITE = {"vllm": "tests/with_vllm/test_vllm_generation.py"}
MAIN_SUITE = tuple(n for n in backend_names() if n not in OWN_SUITE)


def test_backends_and_what_they_declare():
    assert backend_names() == ("hf", "static", "vllm")
    hf, static, vllm = (get_backend(n) for n in backend_names())
    assert (hf.records_logprobs, static.records_logprobs, vllm.records_logprobs) == (0, 1, 1)
    assert (hf.seeds_rows, static.seeds_rows, vllm.seeds_rows) == (False, True, True)
    assert [b.needs_weight_sync for b in (hf, static, vllm)] == [False, False, True]
    assert [b.uses_model for b in (hf, static, vllm)] == [True, True, False]
    with pytest.raises(ValueError, match=r"--generation_backend must be one of .*'static'"):
        get_backend("fast")


def _option(parser, flag):
    return next(a for a in parser._actions if flag in a.option_strings)


@pytest.mark.parametrize("program", [PPOStageConfig, InferenceArgs])
def test_the_flag_is_made_from_the_registry(program):
    action = _option(build_parser(program), "--generation_backend")
    assert tuple(action.choices) == ("auto", *backend_names())
    for name in backend_names():
        assert f"`{name}`: {get_backend(name).summary}" in action.help


def test_a_backend_is_one_module(tmp_path, monkeypatch):
    """A module in the backends package that defines BACKEND is a backend: nothing else to edit."""
    extra = tmp_path / "greedy_first.py"
    extra.write_text(
        textwrap.dedent(
            """
            from marlhf.models.generation.base import GenerationBackend

            class Greedy(GenerationBackend):
                name = "greedy_first"
                summary = "the first token, always."

                @classmethod
                def open(cls, cfg, setup):
                    return cls()

                def sample(self, prompt_ids, prompt_mask, cfg, eos_ids, pad_id, row_seeds=None):
                    return prompt_ids[:, -1:].repeat(1, 2), None, None

            BACKEND = Greedy
            """
        )
    )
    monkeypatch.setattr(backends_package, "__path__", [*backends_package.__path__, str(tmp_path)])
    reg.registry.cache_clear()
    try:
        assert backend_names() == ("greedy_first", "hf", "static", "vllm")
        assert "`greedy_first`: the first token, always." in reg.backends_help()
        sampler = open_sampler("greedy_first", SamplingConfig(), SamplerSetup())
        out = sample_responses(
            sampler, torch.tensor([[4, 5]]), torch.ones(1, 2), SamplingConfig(), [5], 0
        )
        assert out.response_ids.tolist() == [[5, 0]] and out.ends_with_eos.tolist() == [True]
    finally:
        monkeypatch.undo()
        sys.modules.pop(f"{backends_package.__name__}.greedy_first", None)
        reg.registry.cache_clear()
    assert "greedy_first" not in backend_names()


def test_auto_picks_the_first_backend_that_can_sample():
    from transformers import GPT2Config, LlamaConfig, MistralConfig

    llama = LlamaConfig(num_hidden_layers=1)
    assert resolve_backend("auto", llama) == "static"
    assert resolve_backend("auto", GPT2Config(n_layer=1)) == "hf"  # a family it is not tested on
    assert resolve_backend("auto", MistralConfig(num_hidden_layers=1, sliding_window=8)) == "hf"
    # ZeRO-3 weights left partitioned: only a backend that samples from the partitions
    assert resolve_backend("auto", llama, zero3=True, gathered=False) == "hf"
    assert resolve_backend("auto", llama, zero3=True, gathered=True) == "static"
    assert resolve_backend("vllm", llama) == "vllm"  # named: as given; auto never picks it


class _Fixed(GenerationBackend):
    """Returns the responses it is given, with log-probs 1 on every token."""

    name, summary = "fixed", "test double"
    records_logprobs = True

    def __init__(self, response):
        self.response = response

    @classmethod
    def open(cls, cfg, setup):  # pragma: no cover - built directly
        raise NotImplementedError

    def sample(self, prompt_ids, prompt_mask, cfg, eos_ids, pad_id, row_seeds=None):
        return self.response, torch.ones(self.response.shape), None


def test_sample_responses_masks_after_the_first_eos():
    raw = torch.tensor([[5, 2, 7, 3], [5, 6, 7, 8], [3, 9, 9, 9]])  # EOS ids 2 and 3
    out = sample_responses(_Fixed(raw), torch.ones(3, 2, dtype=torch.long), torch.ones(3, 2),
                           SamplingConfig(), [2, 3], pad_id=0)  # fmt: skip
    want_mask, want_resp, want_ends = [], [], []
    for row in raw.tolist():  # a plain loop: valid up to and including the first EOS
        n = next((i + 1 for i, t in enumerate(row) if t in (2, 3)), len(row))
        want_mask.append([i < n for i in range(len(row))])
        want_resp.append([t if i < n else 0 for i, t in enumerate(row)])
        want_ends.append(n < len(row) or row[-1] in (2, 3))
    assert out.action_mask.tolist() == want_mask
    assert out.response_ids.tolist() == want_resp and out.ends_with_eos.tolist() == want_ends
    assert out.logprobs.tolist() == [[float(m) for m in r] for r in want_mask]
    assert out.entropy is None
    # nothing sampled at all: one padding column, no record
    empty = sample_responses(_Fixed(torch.zeros(2, 0, dtype=torch.long)), torch.ones(2, 3,
                             dtype=torch.long), torch.ones(2, 3), SamplingConfig(), [2], pad_id=0)  # fmt: skip
    assert empty.response_ids.tolist() == [[0], [0]] and empty.logprobs is None
    assert empty.action_mask.tolist() == [[True], [True]]


def test_sampling_flags_are_checked_once_for_every_program():
    for bad, flag in (({"temperature": 0}, "--temperature"), ({"top_k": -1}, "--top_k"),
                      ({"top_p": 1.5}, "--top_p"), ({"max_answer_seq_len": 0}, "--max_answer_seq_len"),
                      ({"generation_backend": "fast"}, "--generation_backend")):  # fmt: skip
        with pytest.raises(ValueError, match=flag):
            SamplingConfig(**bad)


def test_every_backend_has_its_evaluation_and_inference_tests():
    """The main suite's parametrised checks cover every backend not listed in OWN_SUITE, and
    each suite listed there exists."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    assert set(MAIN_SUITE) | set(OWN_SUITE) == set(backend_names())
    for path in OWN_SUITE.values():
        text = (root / path).read_text()
        assert "check_evaluation" in text and "check_inference" in text


def test_doctests():
    import doctest

    assert doctest.testmod(reg, raise_on_error=False).failed == 0
