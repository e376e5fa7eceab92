import torch

from marlhf.config import ModelConfig
from marlhf.models import (
    apply_lora,
    load_causal_lm,
    load_tokenizer,
    merge_lora_state_dict,
    unwrap_peft,
)
from marlhf.tiny import build_tiny, train_tokenizer

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
    from marlhf.models import set_model_dropout

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
