import doctest
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import marlhf.models.reward_model as reward_model
from marlhf.models.reward_model import (
    RewardModel,
    end_score_index,
    end_scores,
    load_reward_model,
    save_reward_model,
    save_reward_model_state,
)
from marlhf.rewards.segment import LocationNormalizer, ScoreStats
from tests.support.tiny_models import tiny_gemma_config

transformers = pytest.importorskip("transformers")

VOCAB = 128


def _tiny_config():
    return tiny_gemma_config(VOCAB)


def _tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
    )


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    """An SFT-style output: a *ForCausalLM checkpoint plus tokenizer."""
    path = tmp_path_factory.mktemp("sft")
    torch.manual_seed(0)
    model = transformers.GemmaForCausalLM(_tiny_config())
    model.save_pretrained(path)
    _tiny_tokenizer().save_pretrained(path)
    return path


def _batch():
    """(2B, T) pair batch: chosen rows then rejected rows, right-padded, differing lengths."""
    g = torch.Generator().manual_seed(3)
    input_ids = torch.randint(4, VOCAB, (4, 7), generator=g)
    lengths = torch.tensor([5, 7, 3, 6])  # chosen: 5, 7 (truncated); rejected: 3, 6
    attention_mask = (torch.arange(7) < lengths.unsqueeze(1)).long()
    input_ids = torch.where(attention_mask.bool(), input_ids, torch.zeros_like(input_ids))
    return input_ids, attention_mask


def test_doctests():
    assert doctest.testmod(reward_model).failed == 0


def test_end_score_index_hand_built_batch():
    # Chosen and rejected differ in length; row 1 is a truncated row without padding; row 4 is a
    # left-padded prompt followed by a right-padded response (PPO layout).
    mask = torch.tensor(
        [
            [1, 1, 1, 1, 0, 0],  # chosen, length 4
            [1, 1, 1, 1, 1, 1],  # chosen, truncated
            [1, 1, 0, 0, 0, 0],  # rejected, length 2
            [1, 1, 1, 1, 1, 0],  # rejected, length 5
            [0, 0, 1, 1, 1, 0],  # left + right padded
        ],
        dtype=torch.bool,
    )
    assert end_score_index(mask).tolist() == [3, 5, 1, 4, 4]
    assert end_score_index(mask.long()).dtype == torch.long
    values = torch.arange(30.0).reshape(5, 6)
    assert end_scores(values, mask).tolist() == [3.0, 11.0, 13.0, 22.0, 28.0]


def test_forward_is_backbone_hidden_state_times_head(sft_dir):
    rm = RewardModel.from_pretrained(sft_dir)
    input_ids, attention_mask = _batch()
    values = rm(input_ids, attention_mask)
    assert values.shape == (4, 7) and values.dtype == torch.float32
    # Independent reference: the causal LM's own base transformer, loaded by transformers.
    lm = transformers.AutoModelForCausalLM.from_pretrained(sft_dir)
    with torch.no_grad():
        hidden = lm.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        expected = hidden @ rm.v_head.weight[0]
    valid = attention_mask.bool()
    torch.testing.assert_close(values[valid], expected[valid], rtol=1e-5, atol=1e-5)


def test_from_pretrained_loads_the_sft_weights_not_random(sft_dir):
    rm = RewardModel.from_pretrained(sft_dir)
    lm = transformers.AutoModelForCausalLM.from_pretrained(sft_dir)
    input_ids, attention_mask = _batch()
    with torch.no_grad():
        ours = rm.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        ref = lm.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        torch.manual_seed(123)
        fresh = transformers.AutoModel.from_config(_tiny_config())
        rand = fresh(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    assert torch.equal(ours, ref)
    assert not torch.allclose(ours, rand)


def test_from_pretrained_refuses_a_checkpoint_with_missing_weights(sft_dir, tmp_path):
    for name in os.listdir(sft_dir):
        if name != "model.safetensors":
            (tmp_path / name).write_bytes((sft_dir / name).read_bytes())
    weights = load_file(sft_dir / "model.safetensors")
    dropped = [k for k in weights if "layers.1.mlp" in k]
    save_file(
        {k: v for k, v in weights.items() if k not in dropped}, tmp_path / "model.safetensors"
    )
    with pytest.raises(ValueError, match="missing"):
        RewardModel.from_pretrained(tmp_path)


def test_right_padding_does_not_change_scores(sft_dir):
    rm = RewardModel.from_pretrained(sft_dir)
    input_ids, attention_mask = _batch()
    with torch.no_grad():
        batched = end_scores(rm(input_ids, attention_mask), attention_mask)
        alone = []
        for row, m in zip(input_ids, attention_mask, strict=True):
            n = int(m.sum())
            v = rm(row[:n].unsqueeze(0), m[:n].unsqueeze(0))
            alone.append(v[0, n - 1])
    torch.testing.assert_close(batched, torch.stack(alone), rtol=1e-5, atol=1e-5)


def test_save_load_round_trip_is_bit_identical(sft_dir, tmp_path):
    torch.manual_seed(7)
    rm = RewardModel.from_pretrained(sft_dir)
    tok = transformers.AutoTokenizer.from_pretrained(sft_dir)
    input_ids, attention_mask = _batch()
    with torch.no_grad():
        before = rm(input_ids, attention_mask)
    norm = LocationNormalizer(a=0.1, b=-0.2, c=0.3, d=0.4)
    stats = ScoreStats(mean=0.5, std=2.0)
    out = tmp_path / "rm"
    save_reward_model(
        rm,
        tok,
        out,
        rm_type="segment",
        score_stats=stats,
        normalizer=norm,
        termination={"termination_condition": "entropy", "entropy_threshold": 2.0},
        extra={"max_seq_len": 512, "eval_accuracy": 0.75},
    )
    assert {
        "config.json",
        "model.safetensors",
        "value_head.safetensors",
        "reward_config.json",
    } <= set(os.listdir(out))
    loaded, info = load_reward_model(out)
    with torch.no_grad():
        after = loaded(input_ids, attention_mask)
    assert torch.equal(before, after)
    assert info["rm_type"] == "segment"
    assert info["score_stats"] == stats
    assert info["normalizer"] == norm
    assert info["termination"] == {"termination_condition": "entropy", "entropy_threshold": 2.0}
    assert info["max_seq_len"] == 512 and info["eval_accuracy"] == 0.75
    # The backbone is a standard HF directory: plain AutoModel loads it, and so does the tokenizer.
    plain = transformers.AutoModel.from_pretrained(out)
    assert type(plain).__name__ == "GemmaModel"
    assert json.loads((out / "config.json").read_text())["architectures"] == ["GemmaModel"]
    assert transformers.AutoTokenizer.from_pretrained(out)("w5 w6")["input_ids"] == [5, 6]
    # The caller's config is not modified by saving.
    assert rm.config.architectures == ["GemmaForCausalLM"]


def test_save_from_state_dict_matches_save_from_model(sft_dir, tmp_path):
    torch.manual_seed(8)
    rm = RewardModel.from_pretrained(sft_dir)
    sd = {k: v.clone() for k, v in rm.state_dict().items()}  # as gathered from ZeRO-3
    save_reward_model_state(sd, rm.config, None, tmp_path / "a", extra={"step": 3})
    save_reward_model(rm, None, tmp_path / "b", extra={"step": 3})
    a, info_a = load_reward_model(tmp_path / "a")
    b, info_b = load_reward_model(tmp_path / "b")
    input_ids, attention_mask = _batch()
    with torch.no_grad():
        assert torch.equal(a(input_ids, attention_mask), b(input_ids, attention_mask))
        assert torch.equal(a(input_ids, attention_mask), rm(input_ids, attention_mask))
    assert info_a == info_b
    assert info_a["rm_type"] == "end" and info_a["score_stats"] is None and info_a["step"] == 3


def test_load_with_dtype(sft_dir, tmp_path):
    rm = RewardModel.from_pretrained(sft_dir)
    save_reward_model(rm, None, tmp_path)
    loaded, _ = load_reward_model(tmp_path, dtype=torch.bfloat16)
    assert loaded.v_head.weight.dtype == torch.bfloat16
    assert next(loaded.backbone.parameters()).dtype == torch.bfloat16
    input_ids, attention_mask = _batch()
    with torch.no_grad():
        assert loaded(input_ids, attention_mask).dtype == torch.float32


def test_save_validation(sft_dir, tmp_path):
    rm = RewardModel.from_pretrained(sft_dir)
    with pytest.raises(ValueError, match="rm_type"):
        save_reward_model(rm, None, tmp_path, rm_type="bandit")
    with pytest.raises(ValueError, match="termination"):
        save_reward_model(rm, None, tmp_path, rm_type="segment")
    with pytest.raises(ValueError, match="reserved"):
        save_reward_model(rm, None, tmp_path, extra={"rm_type": "end"})
    sd = dict(rm.state_dict())
    sd["lm_head.weight"] = torch.zeros(VOCAB, 32)
    with pytest.raises(ValueError, match="lm_head.weight"):
        save_reward_model_state(sd, rm.config, None, tmp_path)
    with pytest.raises(FileNotFoundError, match="reward_config.json"):
        load_reward_model(sft_dir)


def test_gradient_checkpointing_gives_the_same_gradients(sft_dir):
    input_ids, attention_mask = _batch()
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        rm = RewardModel.from_pretrained(sft_dir)
        rm.train()
        if checkpointing:
            rm.gradient_checkpointing_enable({"use_reentrant": False})
            assert rm.is_gradient_checkpointing
        end_scores(rm(input_ids, attention_mask), attention_mask).sum().backward()
        grads.append(rm.backbone.layers[0].mlp.up_proj.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_peft_lora_wraps_the_reward_model(sft_dir):
    peft = pytest.importorskip("peft")
    rm = RewardModel.from_pretrained(sft_dir)
    lora = peft.get_peft_model(
        rm, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["v_head"])
    )
    input_ids, attention_mask = _batch()
    with torch.no_grad():
        # LoRA B starts at zero: the wrapped model scores exactly like the base.
        torch.testing.assert_close(lora(input_ids, attention_mask), rm(input_ids, attention_mask))
    trainable = {n for n, p in lora.named_parameters() if p.requires_grad}
    assert any("lora_A" in n for n in trainable) and any("v_head" in n for n in trainable)
    assert not any("embed_tokens" in n for n in trainable)


def test_value_head_from_a_causal_lm_prints_no_load_report(tmp_path, capfd, caplog):
    """The causal LM's head is "unexpected" for a backbone; transformers' report of it is noise."""
    from marlhf.models.reward_model import RewardModel
    from marlhf.models.zoo import build_tiny

    path = build_tiny(tmp_path / "lm", ["a cat sat on the mat"] * 10)
    RewardModel.from_pretrained(path)
    out = capfd.readouterr()
    assert "LOAD REPORT" not in out.err + out.out + caplog.text
