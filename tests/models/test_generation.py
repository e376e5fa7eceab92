"""The generation-backend registry (marlhf.models.generation): the built-in backends declared
without torch and implemented by reference, a backend of one's own in one ``--plugin`` file, the
flag's choices and help made from the registry in every program, ``auto``'s choice, and the one
sampling call (its masks against an independent loop). PPO's evaluation and ``marlhf infer`` on every backend:
``tests/stages/ppo/test_evaluation.py``, ``tests/inference/test_backends.py`` (vLLM:
``tests/with_vllm/``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from marlhf.cli import build_parser, parse_config
from marlhf.inference import InferenceArgs
from marlhf.models.generation import (
    GenerationBackend,
    SamplerSetup,
    SamplingConfig,
    backend_info,
    backend_names,
    get_backend,
    open_sampler,
    resolve_backend,
)
from marlhf.models.generation import registry as reg
from marlhf.models.generation.sampling import sample_responses
from marlhf.plugins import plugin_module_name
from marlhf.stages.ppo.config import PPOStageConfig

# the backends whose evaluation and inference checks run in a suite of their own
OWN_SUITE = {"vllm": "tests/with_vllm/test_vllm_generation.py"}
MAIN_SUITE = tuple(n for n in backend_names() if n not in OWN_SUITE)


def test_backends_and_what_they_declare():
    assert backend_names() == ("hf", "static", "vllm")
    hf, static, vllm = (backend_info(n) for n in backend_names())
    assert (hf.records_logprobs, static.records_logprobs, vllm.records_logprobs) == (0, 1, 1)
    assert (hf.seeds_rows, static.seeds_rows, vllm.seeds_rows) == (False, True, True)
    assert [b.needs_weight_sync for b in (hf, static, vllm)] == [False, False, True]
    assert [b.uses_model for b in (hf, static, vllm)] == [True, True, False]
    assert [b.continues_conversations for b in (hf, static, vllm)] == [False, True, False]
    for name in ("fast", "auto"):
        with pytest.raises(ValueError, match=r"--generation_backend must be one of .*'static'"):
            get_backend(name)


def test_a_built_in_backend_is_declared_and_implemented_by_reference():
    """The registry holds each built-in's declaration until it is opened; its implementation is a
    subclass with the same attributes that takes the declaration's place."""
    for decl in (reg.HF, reg.Static, reg.VLLM):
        module, _, attr = decl.implementation.partition(":")
        impl = get_backend(decl.name)
        assert issubclass(impl, decl) and (impl.__module__, impl.__name__) == (module, attr)
        assert backend_info(decl.name) is impl and "implementation" not in impl.__dict__
        assert (impl.name, impl.summary, impl.auto_rank) == (
            decl.name,
            decl.summary,
            decl.auto_rank,
        )
        assert impl.supports.__func__ is decl.supports.__func__  # auto reads the declaration's
    with pytest.raises(ValueError, match="registered twice"):
        reg.register_backend(type("Again", (GenerationBackend,), {"name": "static"}))
    with pytest.raises(ValueError, match="registered twice"):
        reg.register_backend(type("Auto", (GenerationBackend,), {"name": "auto"}))


def test_the_registry_and_the_package_import_no_torch():
    """The configuration reads the registry: importing it (and the package, which every backend
    module's import runs) loads neither torch nor a backend's implementation."""
    probe = (
        "import sys, json, marlhf.models.generation.registry as r, marlhf.models.generation; "
        "print(json.dumps([[m for m in ('torch', 'transformers') if m in sys.modules], "
        "[m for m in sys.modules if m.startswith('marlhf.models.generation.backends.')], "
        "[b.implementation for b in r.BACKENDS.values()]]))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=300, check=True)  # fmt: skip
    heavy, implementations, references = json.loads(proc.stdout.strip().splitlines()[-1])
    assert heavy == [] and implementations == []
    assert references == [f"marlhf.models.generation.backends.{m}:{c}Backend"
                          for m, c in (("hf", "HF"), ("static", "Static"), ("vllm", "VLLM"))]  # fmt: skip


def _option(parser, flag):
    return next(a for a in parser._actions if flag in a.option_strings)


@pytest.mark.parametrize("program", [PPOStageConfig, InferenceArgs])
def test_the_flag_is_made_from_the_registry(program):
    action = _option(build_parser(program), "--generation_backend")
    assert tuple(action.choices) == ("auto", *backend_names())
    for name in backend_names():
        assert f"`{name}`: {backend_info(name).summary}" in action.help


# a backend of one's own: the example of docs/extending.md
GREEDY_PLUGIN = """
import torch

from marlhf.models.generation.base import GenerationBackend
from marlhf.models.generation.registry import register_backend


@register_backend
class Greedy(GenerationBackend):
    \"\"\"The most likely token at every step, by transformers' generate on the caller's model.\"\"\"

    name = "greedy"
    summary = "the most likely token at every step (no sampling: --temperature, --top_k, --top_p unused)."

    def __init__(self, model):
        self.model = model

    @classmethod
    def open(cls, cfg, setup):
        if setup.model is None:
            raise ValueError("--generation_backend greedy decodes with the policy: no model was loaded")
        return cls(setup.model)

    @torch.no_grad()
    def sample(self, prompt_ids, prompt_mask, cfg, eos_ids, pad_id, row_seeds=None):
        out = self.model.generate(
            input_ids=prompt_ids, attention_mask=prompt_mask.long(), do_sample=False,
            max_new_tokens=cfg.max_answer_seq_len, eos_token_id=eos_ids, pad_token_id=pad_id,
        )
        return out[:, prompt_ids.shape[1]:], None, None
"""


def _greedy_reference(model, prompt: list[int], n: int, eos: list[int]) -> list[int]:
    """A plain loop: the argmax of a full forward pass, token by token, up to the first EOS."""
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            tok = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(tok)
            out.append(tok)
            if tok in eos:
                break
    return out


def test_a_plugin_file_registers_a_backend(tmp_path):
    """A backend of one's own is one file that --plugin names: a value of --generation_backend in
    every program, listed in the help, opened and sampled through like a built-in one."""
    from transformers import GemmaForCausalLM

    from tests.support.tiny_models import tiny_gemma_config

    path = tmp_path / "my_backend.py"
    path.write_text(GREEDY_PLUGIN)
    try:
        for program, extra in ((PPOStageConfig, []), (InferenceArgs, ["--model", "m"])):
            cfg = parse_config(
                program, ["--plugin", str(path), "--generation_backend", "greedy", *extra]
            )
            sampling = cfg.generation if program is PPOStageConfig else cfg.inference.sampling
            assert sampling.generation_backend == "greedy"
        assert backend_names() == ("hf", "static", "vllm", "greedy")
        assert "`greedy`: the most likely token at every step" in reg.backends_help()
        assert backend_info("greedy") is get_backend("greedy")  # no reference to import
        assert resolve_backend("greedy", None) == "greedy"

        torch.manual_seed(0)
        model = GemmaForCausalLM(tiny_gemma_config(vocab=40)).eval()
        cfg = SamplingConfig(max_answer_seq_len=6, generation_backend="greedy")
        sampler = open_sampler("greedy", cfg, SamplerSetup(model=model))
        prompts = torch.tensor([[2, 7, 9, 11], [2, 30, 4, 5], [2, 3, 3, 8]])
        eos = [1, 17]
        out = sample_responses(sampler, prompts, torch.ones(3, 4), cfg, eos, pad_id=0)
        for row, prompt in enumerate(prompts.tolist()):
            want = _greedy_reference(model, prompt, 6, eos)
            n = len(want)
            assert out.response_ids[row, :n].tolist() == want
            assert out.response_ids[row, n:].eq(0).all() and out.action_mask[row].sum() == n
            assert out.ends_with_eos[row].item() == (want[-1] in eos)
        assert out.logprobs is None and out.entropy is None
    finally:
        reg.BACKENDS.pop("greedy", None)
        sys.modules.pop(plugin_module_name(path), None)
    assert "greedy" not in backend_names()
    with pytest.raises(SystemExit):  # without its plugin the name is no backend
        parse_config(PPOStageConfig, ["--generation_backend", "greedy"])
    with pytest.raises(ValueError, match="--generation_backend must be one of"):
        SamplingConfig(generation_backend="greedy")


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
