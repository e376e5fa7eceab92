"""The random ``tiny`` model's files: written the same in every process (transformers 5's
``save_pretrained`` writes nothing but the tokenizer on ranks other than 0), published atomically,
and an incomplete copy left by older versions is replaced."""

from __future__ import annotations

import json

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from marlhf.models import zoo

CORPUS = ["POST\nSubreddit: r/cats\nMy cat is old.\nTL;DR: ", "my cat is old"] * 20


def _tensors(path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()} | {"__meta__": f.metadata()}


def test_save_model_files_writes_what_save_pretrained_writes(tmp_path):
    ours = zoo.build_tiny(tmp_path / "ours", CORPUS)
    model = AutoModelForCausalLM.from_pretrained(ours)
    model.save_pretrained(tmp_path / "hf")  # the independent reference (one process)
    a, b = _tensors(ours / "model.safetensors"), _tensors(tmp_path / "hf" / "model.safetensors")
    assert a.pop("__meta__") == b.pop("__meta__")
    assert sorted(a) == sorted(b) and "lm_head.weight" not in a
    for k in a:
        assert torch.equal(a[k], b[k]), k
    for name in ("config.json", "generation_config.json"):
        assert json.loads((ours / name).read_text()) == json.loads(
            (tmp_path / "hf" / name).read_text()
        )


def test_ensure_tiny_replaces_a_tokenizer_only_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("MARLHF_HOME", str(tmp_path / "home"))
    first = zoo.ensure_tiny()
    good = {p.name for p in (tmp_path / "home" / "tiny").glob("*/*")}
    for p in list((tmp_path / "home" / "tiny").glob("*/*")):
        if not p.name.startswith("tokenizer"):
            p.unlink()  # what an older version left when a rank other than 0 won the race
    assert zoo.ensure_tiny() == first
    assert {p.name for p in (tmp_path / "home" / "tiny").glob("*/*")} == good
    assert not [p for p in (tmp_path / "home" / "tiny").iterdir() if p.name.startswith(".")]
    AutoModelForCausalLM.from_pretrained(first)
