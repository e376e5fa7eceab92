import torch

from marlhf.config import ModelConfig
from marlhf.models.load import load_causal_lm, load_tokenizer
from marlhf.models.lora import apply_lora, merge_lora_state_dict, unwrap_peft
from marlhf.models.zoo import build_tiny, train_tokenizer

CORPUS = [
    "POST\nSubreddit: r/cats\nMy cat Tom is ten years old and gained weight.\nTL;DR: ",
    "my cat gained weight and I need diet advice",
    "POST\nSubreddit: r/dogs\nOur dog Rex barks at night when the neighbours come home.\nTL;DR: ",
    "dog barks at night",
] * 20


def test_tokenizer_round_trip_and_bos(tmp_path):
    tok = train_tokenizer(CORPUS, vocab_size=300)
    ids = tok("My cat Tom")["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "My cat Tom"
    assert tok.pad_token_id is not None and tok.eos_token_id is not None


def test_tiny_saves_and_reloads_as_hf_directory(tmp_path):
    path = build_tiny(tmp_path / "tiny", CORPUS)
    cfg = ModelConfig(model_name_or_path=str(path))
    tok = load_tokenizer(cfg, padding_side="left")
    model = load_causal_lm(cfg)
    assert type(model).__name__ == "GemmaForCausalLM"
    assert tok.padding_side == "left"
    batch = tok(["My cat", "Our dog Rex barks"], return_tensors="pt", padding=True)
    out = model.generate(**batch, max_new_tokens=5, do_sample=True, top_k=0)
    assert out.shape[0] == 2 and out.shape[1] <= batch["input_ids"].shape[1] + 5


def test_lora_merge_equals_peft_merge(tmp_path):
    path = build_tiny(tmp_path / "tiny", CORPUS)
    cfg = ModelConfig(
        model_name_or_path=str(path), lora_dim=4, lora_alpha=8.0, lora_module_name="layers."
    )
    torch.manual_seed(0)
    model = apply_lora(load_causal_lm(cfg), cfg)
    # non-zero LoRA B so the merge matters
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.1)
    base, scaling = unwrap_peft(model)
    assert scaling == 2.0
    merged = merge_lora_state_dict(model.state_dict(), scaling)
    reference = model.merge_and_unload().state_dict()
    assert set(merged) == set(reference)
    for k in reference:
        torch.testing.assert_close(merged[k], reference[k])


def test_lora_trains_only_adapters_when_asked(tmp_path):
    path = build_tiny(tmp_path / "tiny", CORPUS)
    cfg = ModelConfig(model_name_or_path=str(path), lora_dim=2, only_optimize_lora=True)
    model = apply_lora(load_causal_lm(cfg), cfg)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_set_model_dropout_reaches_built_modules(tmp_path):
    from marlhf.models.load import set_model_dropout

    path = build_tiny(tmp_path / "tiny", CORPUS)
    model = load_causal_lm(ModelConfig(model_name_or_path=str(path)))
    set_model_dropout(model, 0.3)
    attn = [m for m in model.modules() if isinstance(getattr(m, "attention_dropout", None), float)]
    assert attn and all(m.attention_dropout == 0.3 for m in attn)
    assert model.config.attention_dropout == 0.3
    model.train()
    x = torch.tensor([[2, 5, 6, 7, 8, 9]])
    # with dropout active two training-mode forwards differ; in eval mode they agree
    assert not torch.equal(model(x).logits, model(x).logits)
    model.eval()
    assert torch.equal(model(x).logits, model(x).logits)


def test_tiny_tokenizer_round_trips_code(tmp_path):
    """Trained on English prose only, the byte-level tokenizer still encodes every character of a
    program and decodes it back unchanged after a save and reload: the APPS code reward executes the
    decoded text, so indentation, newlines, tabs and brackets must survive."""
    train_tokenizer(CORPUS, vocab_size=300).save_pretrained(tmp_path / "tok")
    tok = load_tokenizer(ModelConfig(model_name_or_path=str(tmp_path / "tok")), padding_side="left")
    programs = [
        "class Solution:\n    def f(self, xs: list[int]) -> int:\n\treturn {'k': [1 , 2]}[\"k\"]\n",
        'import sys\nfor line in sys.stdin:\n    print(line.rstrip("\\r\\n")[::-1], end="")\n',
        "x = 3 ** 2 // 1 % 5  # é ü 中 ~ $ @ `\r\n\n\n  \n",
    ]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in programs]
    assert all(tok.unk_token_id not in row for row in ids)
    assert [tok.decode(row) for row in ids] == programs
    # as the trainer decodes responses: a right-padded batch ending in EOS, special tokens skipped
    width = max(map(len, ids)) + 1
    batch = [row + [tok.eos_token_id] + [tok.pad_token_id] * (width - len(row) - 1) for row in ids]
    assert tok.batch_decode(batch, skip_special_tokens=True) == programs


# --- a model that is not there, or not what the flag expects --------------------------------------
def _reward_model_dir(tmp_path):
    from marlhf.models.reward_model import RewardModel, save_reward_model

    actor = build_tiny(tmp_path / "sft", CORPUS)
    tok = load_tokenizer(ModelConfig(model_name_or_path=str(actor)))
    save_reward_model(RewardModel.from_pretrained(actor), tok, tmp_path / "rm")
    return actor, tmp_path / "rm"


def test_reward_model_dir_is_refused_as_a_causal_lm(tmp_path):
    """A reward-model directory loaded as the actor / reference / SFT base would get a random LM
    head: refused, naming the path and the flags to use instead."""
    import pytest

    actor, rm = _reward_model_dir(tmp_path)
    with pytest.raises(ValueError) as e:
        load_causal_lm(ModelConfig(model_name_or_path=str(rm)))
    msg = str(e.value)
    assert str(rm) in msg and "reward-model directory" in msg and "reward_config.json" in msg
    assert "--critic_model_name_or_path" in msg and "--actor_model_name_or_path" in msg
    # the SFT directory it was trained from still loads
    assert load_causal_lm(ModelConfig(model_name_or_path=str(actor))) is not None


def test_missing_local_model_does_not_exist(tmp_path, monkeypatch):
    import pytest

    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    for load in (load_tokenizer, load_causal_lm):
        for name in ("out/sft", "./sft", str(tmp_path / "nowhere" / "sft")):
            with pytest.raises(FileNotFoundError) as e:
                load(ModelConfig(model_name_or_path=name))
            msg = str(e.value)
            assert "does not exist" in msg and name.lstrip("./") in msg and "\n" not in msg


def test_hub_model_missing_from_the_cache_offline_names_model_and_variable(tmp_path, monkeypatch):
    import pytest

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    for load in (load_tokenizer, load_causal_lm):
        with pytest.raises(FileNotFoundError) as e:
            load(ModelConfig(model_name_or_path="google/gemma-2b"))
        msg = str(e.value)
        assert "google/gemma-2b" in msg and "not in the local cache" in msg
        assert "HF_HUB_OFFLINE=1" in msg and str(tmp_path / "hf" / "hub") in msg
        assert "\n" not in msg


def test_hub_model_in_the_cache_loads_offline(tmp_path, monkeypatch):
    """The cache lookup agrees with transformers: a model in the hub cache layout loads offline."""
    import shutil

    src = build_tiny(tmp_path / "tiny", CORPUS)
    repo = tmp_path / "hf" / "hub" / "models--someone--tiny"
    shutil.copytree(src, repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    cfg = ModelConfig(model_name_or_path="someone/tiny")
    assert load_tokenizer(cfg).eos_token_id is not None
    assert type(load_causal_lm(cfg)).__name__ == "GemmaForCausalLM"


def test_directory_without_config_is_no_model(tmp_path):
    import pytest

    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "latest.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_causal_lm(ModelConfig(model_name_or_path=str(tmp_path / "half")))
