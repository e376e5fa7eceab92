"""Packed rows: the layout against a plain loop, and every whitelisted model type's packed forward
against its padded forward (logits, value-model values, the LM loss and its gradient), in float32
and bfloat16, for left- and right-padded batches with rows of length 1 and batches of one row."""

from __future__ import annotations

import doctest

import pytest
import torch

from marlhf.models import packing as pk
from marlhf.models.lm_loss import causal_lm_loss_sum, lm_loss_sum
from marlhf.models.response_logits import logits_at
from marlhf.models.reward_model import RewardModel

V = 61


def test_doctests():
    assert doctest.testmod(pk).failed == 0


def _batch(lengths: list[int], left: bool, seed: int = 0):
    """(ids, mask): rows of ``lengths`` tokens in [3, V), padded with 0 on the left or right."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.zeros(len(lengths), T, dtype=torch.long)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for b, n in enumerate(lengths):
        cols = slice(T - n, T) if left else slice(0, n)
        ids[b, cols] = torch.randint(3, V, (n,), generator=g)
        mask[b, cols] = 1
    return ids, mask


LENGTHS = {
    "mixed": [7, 1, 4, 7, 2, 5],  # rows of length 1, bins holding several rows
    "one_row": [6],
    "equal": [5, 5, 5],  # no padding: one row per bin, the padded batch itself
    "ones": [1, 1, 1],
}


@pytest.mark.parametrize("layout", ["bins", "varlen"])
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("case", list(LENGTHS))
def test_layout_against_a_loop(case, left, layout):
    ids, mask = _batch(LENGTHS[case], left)
    p = pk.pack_rows(ids, mask, layout=layout)
    K, C = p.input_ids.shape
    capacity = sum(LENGTHS[case]) if layout == "varlen" else max(LENGTHS[case])
    assert C == capacity
    assert K == 1 if layout == "varlen" else K <= len(LENGTHS[case])
    flat_ids, flat_pos = p.input_ids.flatten().tolist(), p.position_ids.flatten().tolist()
    used = set()
    for b in range(ids.shape[0]):
        tokens = [int(t) for t, m in zip(ids[b], mask[b], strict=True) if m]
        places = [int(i) for i in p.index[b] if i >= 0]
        assert len(places) == len(tokens) == int(p.lengths[b])
        assert places == list(range(places[0], places[0] + len(tokens)))  # contiguous, in order
        assert places[0] // C == places[-1] // C  # within one bin
        assert [flat_ids[i] for i in places] == tokens
        assert [flat_pos[i] for i in places] == list(range(len(tokens)))
        assert not used & set(places)
        used |= set(places)
        # padding of the input maps nowhere
        assert all(
            (i < 0) == (not m) for i, m in zip(p.index[b].tolist(), mask[b].tolist(), strict=True)
        )
    # the bins' padding continues the last row's positions: a row starts exactly where a position
    # is 0, so the attention sees one sequence per row
    assert sum(1 for x in flat_pos if x == 0) == ids.shape[0]
    assert torch.equal(p.unpack(p.input_ids, fill=0), ids * mask)
    if case == "equal" and layout == "bins":
        assert torch.equal(p.input_ids, ids) and torch.equal(p.position_ids[0], torch.arange(5))


def test_varlen_arguments_are_transformers_own():
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    ids, mask = _batch([4, 1, 6, 3], left=False)
    p = pk.pack_rows(ids, mask, layout="varlen")
    (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(p.position_ids)
    kw = p.attention_kwargs
    assert kw["cu_seq_lens_q"].tolist() == cu_q.tolist() == kw["cu_seq_lens_k"].tolist()
    assert kw["max_length_q"] == int(max_q) == kw["max_length_k"] == 6
    assert pk.pack_rows(ids, mask).attention_kwargs == {}


def _configs():
    from transformers import (
        Gemma2Config,
        GemmaConfig,
        GPT2Config,
        LlamaConfig,
        MistralConfig,
        Qwen2Config,
        Qwen3Config,
    )

    common = dict(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    return {
        "gemma": lambda: GemmaConfig(**common, head_dim=16),
        "gemma2": lambda: Gemma2Config(**common, head_dim=16, sliding_window=4),
        "llama": lambda: LlamaConfig(**common),
        "mistral": lambda: MistralConfig(**common, sliding_window=None),
        "qwen2": lambda: Qwen2Config(**common),
        "qwen3": lambda: Qwen3Config(**common, head_dim=16),
        "gpt2": lambda: GPT2Config(
            vocab_size=V,
            n_embd=32,
            n_layer=2,
            n_head=2,
            n_positions=64,
            bos_token_id=2,
            eos_token_id=1,
            pad_token_id=0,
        ),  # fmt: skip
    }


def test_the_whitelist_is_what_is_tested():
    assert set(_configs()) == set(pk.PACKED_MODEL_TYPES)


def _causal_lm(kind: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(_configs()[kind](), dtype=dtype).eval()


TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=0.05, atol=0.05)}


def _padded_positions(mask: torch.Tensor) -> torch.Tensor:
    """Positions 0, 1, ... of each row's tokens (as after a left-padded prompt)."""
    return (mask.cumsum(1) - 1).clamp(min=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", list(pk.PACKED_MODEL_TYPES))
def test_packed_logits_equal_padded_logits(kind, dtype):
    model = _causal_lm(kind, dtype)
    assert pk.packing_mode(model) == "bins"
    for case in ("mixed", "one_row", "ones"):
        for left in (False, True):
            ids, mask = _batch(LENGTHS[case], left, seed=len(case))
            with torch.no_grad():
                want = model(
                    input_ids=ids, attention_mask=mask, position_ids=_padded_positions(mask),
                    use_cache=False,
                ).logits  # fmt: skip
                p = pk.pack_rows(ids, mask)
                got = p.unpack(model(**pk.packed_inputs(p)).logits)
            valid = mask.bool()
            torch.testing.assert_close(
                got[valid].float(), want[valid].float(), **TOL[dtype], msg=f"{case} left={left}"
            )


@pytest.mark.parametrize("kind", ["gemma", "gpt2"])
def test_the_lm_head_at_chosen_packed_positions(kind):
    """``logits_at(..., flat=True)``: the head at some positions of the packed rows gives the
    padded logits at those positions."""
    model = _causal_lm(kind, torch.float32)
    ids, mask = _batch(LENGTHS["mixed"], left=False)
    pos = torch.tensor([[0, 3, 6], [0, 0, 0], [1, 2, 3], [6, 5, 4], [0, 1, 1], [4, 3, 2]])
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        want = want.gather(1, pos[..., None].expand(-1, -1, V))
        p = pk.pack_rows(ids, mask)
        flat = p.index.gather(1, pos).clamp(min=0)
        with logits_at(model, flat, flat=True) as hooked:
            got = model(**pk.packed_inputs(p)).logits
    assert hooked and got.shape == want.shape
    valid = mask.bool().gather(1, pos)
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["gemma", "llama", "gpt2"])
def test_packed_values_equal_padded_values(kind, dtype):
    """The value head (critic, reward model) over packed rows."""
    from transformers import AutoModel

    torch.manual_seed(0)
    rm = RewardModel(AutoModel.from_config(_configs()[kind](), dtype=dtype), init_std=0.5).eval()
    assert pk.packing_mode(rm) == "bins"
    for left in (False, True):
        ids, mask = _batch(LENGTHS["mixed"], left, seed=3)
        with torch.no_grad():
            want = rm(ids, mask)  # positions from the mask
            p = pk.pack_rows(ids, mask)
            got = p.unpack(rm(**pk.packed_inputs(p)))
        valid = mask.bool()
        torch.testing.assert_close(got[valid], want[valid], **TOL[dtype])
        assert (got[~valid] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["gemma", "llama", "gpt2"])
def test_packed_lm_loss_and_gradient_equal_padded(kind, dtype):
    """The SFT loss: labels with the prompt masked and labels that are the whole row (where the
    row's first label, which nothing predicts in the padded layout, must not be trained)."""
    model = _causal_lm(kind, dtype)
    ids, mask = _batch(LENGTHS["mixed"], left=False, seed=5)
    prompt_masked = ids.masked_fill(~mask.bool(), -100)
    prompt_masked[:, :2] = -100
    whole = ids.masked_fill(~mask.bool(), -100)
    for labels in (prompt_masked, whole):
        results = []
        for packing in (False, True):
            model.zero_grad()
            nll, n = causal_lm_loss_sum(model, ids, mask, labels, packing=packing)
            (nll / n).backward()
            grads = [q.grad.float().clone() for q in model.parameters() if q.grad is not None]
            results.append((nll.detach(), n, grads))
        (want, n_want, g_want), (got, n_got, g_got) = results
        assert int(n_got) == int(n_want)
        torch.testing.assert_close(got, want, **TOL[dtype])
        for a, b in zip(g_got, g_want, strict=True):
            torch.testing.assert_close(a, b, rtol=TOL[dtype]["rtol"], atol=TOL[dtype]["atol"] / 10)
    # the independent reference: the loss of each row alone
    rows = [lm_loss_sum(model(input_ids=ids[b : b + 1, : int(mask[b].sum())]).logits,
                        whole[b : b + 1, : int(mask[b].sum())]) for b in range(ids.shape[0])]  # fmt: skip
    nll, _ = causal_lm_loss_sum(model, ids, mask, whole, packing=True)
    torch.testing.assert_close(nll.detach(), sum(r[0] for r in rows).detach(), **TOL[dtype])


def test_models_that_do_not_pack_exactly_run_padded():
    from transformers import AutoModelForCausalLM, GPTNeoXConfig

    cfg = GPTNeoXConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64)  # fmt: skip
    model = AutoModelForCausalLM.from_config(cfg)
    assert pk.packing_mode(model) is None
    ids, mask = _batch(LENGTHS["mixed"], left=False)
    labels = ids.masked_fill(~mask.bool(), -100)
    with torch.no_grad():
        packed = causal_lm_loss_sum(model, ids, mask, labels, packing=True)
        padded = lm_loss_sum(model(input_ids=ids, attention_mask=mask).logits, labels)
    assert torch.equal(packed[0], padded[0])
    # an attention implementation that does not read packed position ids
    llama = _causal_lm("llama", torch.float32)
    llama.config._attn_implementation = "flex_attention"
    assert pk.packing_mode(llama) is None
    llama.config._attn_implementation = "flash_attention_2"
    assert pk.packing_mode(llama) == "varlen"


def test_packing_is_skipped_where_no_two_rows_share_a_bin():
    def mask(lengths):
        return _batch(lengths, left=False)[1]

    assert pk.packs(mask([7, 1, 4, 7]), "bins")  # 1 + 4 fit in 7
    assert not pk.packs(mask([5, 4, 3]), "bins")  # 3 + 4 > 5: one row per bin, the padded batch
    assert not pk.packs(mask([6]), "bins") and not pk.packs(mask([5, 5, 5]), "bins")
    assert pk.packs(mask([5, 4, 3]), "varlen")  # no padding at all
    assert not pk.packs(mask([7, 1]), None)
    ids, m = _batch([5, 4, 3], left=False)
    p = pk.pack_rows(ids, m)
    assert p.input_ids.shape[0] == 3  # what packing would have given: one row per bin
