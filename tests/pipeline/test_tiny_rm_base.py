"""The shipped reward-model base (`tiny-rm-base`) and its recipe (`python -m marlhf.tiny --rm_base`).

Its quality as a reward model (held-out accuracy, correlation with gold) is asserted where it is used:
tests/pipeline/test_demo_bf16.py runs the RM stage of the demo's TL;DR task on it (30 steps, in fp32
and bf16) and holds its accuracies and correlation to floors."""

import json
from pathlib import Path

import pytest
import torch

from marlhf.models import zoo
from marlhf.pipeline import recipes


def test_tiny_rm_base_ships_with_the_policy_tokenizer_and_more_layers():
    path = Path(zoo.ensure_tiny_rm_base())
    assert path == zoo.RM_BASE_DIR
    for name in (*zoo.RM_BASE_FILES, "value_head.safetensors", "pretraining.json"):
        assert (path / name).is_file(), name
    # PPO scores the policy's token ids with the RM: the vocabularies must be identical
    assert (path / "tokenizer.json").read_bytes() == (zoo.BASE_DIR / "tokenizer.json").read_bytes()
    cfg = json.loads((path / "config.json").read_text())
    base = json.loads((zoo.BASE_DIR / "config.json").read_text())
    assert cfg["num_hidden_layers"] == base["num_hidden_layers"] + recipes.RM_EXTRA_LAYERS
    assert cfg["num_key_value_heads"] == recipes.RM_KV_HEADS
    for key in ("hidden_size", "vocab_size", "max_position_embeddings", "head_dim"):
        assert cfg[key] == base[key], key
    assert cfg["dtype"] == "float32"
    record = json.loads((path / "pretraining.json").read_text())
    assert record["recipe"] == "python -m marlhf.tiny --rm_base OUT_DIR"
    assert record["lm_flags"][: len(recipes.RM_LM_FLAGS)] == list(recipes.RM_LM_FLAGS)
    # everything bundled stays small
    assert sum(f.stat().st_size for f in path.iterdir()) < 3_000_000


def test_tiny_rm_base_loads_as_a_reward_model_with_its_head():
    from marlhf.models.reward_model import RewardModel, load_value_head

    rm = RewardModel.from_pretrained(zoo.ensure_tiny_rm_base())
    load_value_head(rm, zoo.ensure_tiny_rm_base())
    assert next(rm.parameters()).dtype == torch.float32
    ids = torch.tensor([[2, 300, 301, 1]])
    assert rm(ids, torch.ones_like(ids)).shape == (1, 4)
    assert float(rm.v_head.weight.detach().abs().sum()) > 0


def test_missing_rm_base_names_the_rebuild_command(monkeypatch, tmp_path):
    monkeypatch.setattr(zoo, "RM_BASE_DIR", tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match="python -m marlhf.tiny --rm_base"):
        zoo.ensure_tiny_rm_base()


def test_build_rm_init_keeps_tiny_base_below_the_new_layers(tmp_path):
    from safetensors.torch import load_file

    out = recipes.build_rm_init(tmp_path / "init", extra_layers=1)
    new = load_file(out / "model.safetensors")
    old = load_file(Path(zoo.ensure_tiny_base()) / "model.safetensors")
    n = json.loads((zoo.BASE_DIR / "config.json").read_text())["num_hidden_layers"]
    for key, value in old.items():
        if key != "lm_head.weight":  # tied to the embeddings; saved once
            assert torch.equal(new[key], value), key
    top = [k for k in new if k.startswith(f"model.layers.{n}.")]
    assert top and not any(k in old for k in top)
    assert not any(k.startswith(f"model.layers.{n + 1}.") for k in new)


def test_expand_kv_heads_keeps_the_function(tmp_path):
    from transformers import AutoModel

    src = Path(zoo.ensure_tiny_base())
    out = recipes.expand_kv_heads(src, tmp_path / "kv", 4)
    a, b = AutoModel.from_pretrained(src).eval(), AutoModel.from_pretrained(out).eval()
    assert b.config.num_key_value_heads == 4 and b.layers[0].self_attn.k_proj.weight.shape[0] == 128
    ids = torch.randint(3, 900, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(b(ids).last_hidden_state, a(ids).last_hidden_state)
    with pytest.raises(ValueError, match="cannot spread 1 key/value heads over 3"):
        recipes.expand_kv_heads(src, tmp_path / "kv3", 3)


@pytest.mark.slow
def test_rm_base_recipe_runs_every_step_and_writes_a_loadable_base(tmp_path, monkeypatch):
    monkeypatch.setenv("MARLHF_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(recipes, "RM_LM_ROWS", 64)
    phases = ((("complete", "swapped"), 3, 3e-4, 2), (recipes._ALL, 2, 3e-4, 1))
    out = recipes.pretrain_rm_base(
        tmp_path / "rm_base",
        ["--max_steps", "2", "--per_device_train_batch_size", "4", "--disable_progress_bar"],
        tmp_path / "work",
        phases=phases,
    )
    for name in (*zoo.RM_BASE_FILES, "value_head.safetensors", "pretraining.json"):
        assert (out / name).is_file(), name
    record = json.loads((out / "pretraining.json").read_text())
    assert set(record["wall_s"]) == {"lm", "pmp"}
    assert [(r["phase"], r["step"]) for r in record["pmp_heldout"]] == [(0, 3), (1, 2)]
    from safetensors.torch import load_file

    assert all(v.dtype == torch.bfloat16 for v in load_file(out / "model.safetensors").values())
    from marlhf.models.reward_model import RewardModel

    assert RewardModel.from_pretrained(out).config.num_key_value_heads == recipes.RM_KV_HEADS
