"""marlhf.models.decode: the static-cache sampling loop against `generate`, an independent top-k/top-p
reference, a chi-square test of the step-1 distribution, seeding and EOS handling."""

import doctest
import math

import pytest
import torch
from transformers import GemmaConfig, GemmaForCausalLM, LlamaConfig, LlamaForCausalLM

import marlhf.models.decode as decode
from marlhf.models.decode import filter_logits, sample

PAD, EOS = 0, 1


def _model(arch: str, vocab: int = 64):
    torch.manual_seed(0)
    common = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=2,
        initializer_range=0.2,  # peaked logits: greedy paths vary and near-ties are rare
    )
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common)).eval()
    return GemmaForCausalLM(GemmaConfig(**common, tie_word_embeddings=False)).eval()


def _prompts(B: int = 4, P: int = 9, vocab: int = 64, seed: int = 1):
    """Left-padded prompts of different lengths (P, P-2, P-5, ...)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (B, P), generator=g)
    lengths = [P - (3 * b) % P for b in range(B)]
    mask = torch.zeros(B, P, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, P - n :] = 1
    return ids.masked_fill(mask == 0, PAD), mask


def test_doctests():
    assert doctest.testmod(decode).failed == 0


@pytest.mark.parametrize("arch", ["llama", "gemma"])
def test_greedy_equals_generate(arch):
    model = _model(arch)
    ids, mask = _prompts()
    ours = sample(model, ids, mask, max_new_tokens=10, top_k=1, eos_ids=[], pad_id=PAD)
    ref = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=10,
        eos_token_id=None,
        pad_token_id=PAD,
    )[:, ids.shape[1] :]
    assert ours.tolist() == ref.tolist()
    assert len({tuple(r) for r in ours.tolist()}) > 1  # the test is not trivially passing


@pytest.mark.parametrize("arch", ["llama", "gemma"])
def test_greedy_with_eos_equals_generate(arch):
    model = _model(arch)
    ids, mask = _prompts()
    free = sample(model, ids, mask, max_new_tokens=10, top_k=1, eos_ids=[], pad_id=PAD)
    eos_ids = sorted({int(free[0, 2]), int(free[1, 5])})  # rows stop at different steps
    ours = sample(model, ids, mask, max_new_tokens=10, top_k=1, eos_ids=eos_ids, pad_id=PAD)
    ref = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=10,
        eos_token_id=eos_ids,
        pad_token_id=PAD,
    )[:, ids.shape[1] :]
    assert ours.tolist() == ref.tolist()


def test_eos_rows_stop_and_loop_stops_early():
    model = _model("llama")
    ids, mask = _prompts(B=4)
    N = 12
    free = sample(model, ids, mask, max_new_tokens=N, top_k=1, eos_ids=[], pad_id=PAD).tolist()
    eos_set = {free[b][2] for b in range(4)}  # every row hits an EOS by step 2
    # reference by a plain loop: copy tokens up to and including the first EOS, then padding
    expected = []
    for row in free:
        out, stopped = [], False
        for t in row:
            out.append(PAD if stopped else t)
            stopped = stopped or t in eos_set
        expected.append(out)
    A = max(next(i for i, t in enumerate(r) if t in eos_set) + 1 for r in free)
    got = sample(
        model,
        ids,
        mask,
        max_new_tokens=N,
        top_k=1,
        eos_ids=sorted(eos_set),
        pad_id=PAD,
        stop_check_every=1,
    )
    assert got.shape == (4, A) and A <= 3
    assert got.tolist() == [r[:A] for r in expected]


def test_sampled_rows_are_padded_after_eos():
    model = _model("llama", vocab=16)  # small vocab: EOS is sampled often
    ids, mask = _prompts(B=16, vocab=16)
    g = torch.Generator().manual_seed(3)
    out = sample(
        model,
        ids,
        mask,
        max_new_tokens=20,
        temperature=1.5,
        eos_ids=[EOS, 5],
        pad_id=PAD,
        generator=g,
    )
    assert out.shape[1] <= 20
    finished = 0
    for row in out.tolist():
        hits = [i for i, t in enumerate(row) if t in (EOS, 5)]
        if hits:
            finished += 1
            assert all(t == PAD for t in row[hits[0] + 1 :])
    assert finished > 0


def test_seeded_generator_reproducible():
    model = _model("gemma")
    ids, mask = _prompts()
    kw = dict(max_new_tokens=8, temperature=0.9, top_k=20, top_p=0.95, eos_ids=[EOS], pad_id=PAD)
    a = sample(model, ids, mask, generator=torch.Generator().manual_seed(7), **kw)
    b = sample(model, ids, mask, generator=torch.Generator().manual_seed(7), **kw)
    c = sample(model, ids, mask, generator=torch.Generator().manual_seed(8), **kw)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def _reference_filter(logits: list[float], top_k: int, top_p: float) -> list[bool]:
    """Which tokens survive top-k then top-p, by plain Python over a sorted list."""
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    kept = order[:top_k] if top_k > 0 else order
    z = sum(math.exp(logits[i]) for i in kept)
    nucleus, mass = [], 0.0
    for i in kept:
        if mass >= top_p and nucleus:
            break
        nucleus.append(i)
        mass += math.exp(logits[i]) / z
    return [i in nucleus for i in range(len(logits))]


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (5, 1.0), (0, 0.6), (8, 0.8), (1, 1.0)])
def test_filter_logits_matches_reference(top_k, top_p):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 20, generator=g) * 2
    kept = torch.isfinite(filter_logits(logits, top_k, top_p))
    for b in range(6):
        assert kept[b].tolist() == _reference_filter(logits[b].tolist(), top_k, top_p)


@pytest.mark.parametrize("noise", ["generator", "row_seeds"])
@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (6, 1.0), (0, 0.7), (10, 0.85)])
def test_step1_distribution_chi_square(top_k, top_p, noise):
    V, T, N = 24, 0.7, 6000
    model = _model("llama", vocab=V)
    ids, mask = _prompts(B=2, P=6, vocab=V)
    # reference: the unpadded prompt through a cache-free forward, then the independent filter
    row = ids[1, mask[1].bool()]
    logits = model(input_ids=row[None], use_cache=False).logits[0, -1].double() / T
    keep = _reference_filter(logits.tolist(), top_k, top_p)
    w = [math.exp(x) if k else 0.0 for x, k in zip(logits.tolist(), keep, strict=True)]
    probs = [x / sum(w) for x in w]
    # N copies of the (left-padded) prompt, one new token each
    out = sample(
        model,
        ids[1:2].expand(N, -1),
        mask[1:2].expand(N, -1),
        max_new_tokens=1,
        temperature=T,
        top_k=top_k,
        top_p=top_p,
        eos_ids=[],
        pad_id=PAD,
        prompt_bucket=1,
        **(
            {"generator": torch.Generator().manual_seed(11)}
            if noise == "generator"
            else {"row_seeds": torch.arange(N) * 7919 + 11}
        ),
    )
    counts = torch.bincount(out[:, 0], minlength=V).tolist()
    assert all(c == 0 for c, k in zip(counts, keep, strict=True) if not k)
    # pool cells with expected count < 5 so the chi-square approximation holds
    cells, pooled_obs, pooled_exp = [], 0, 0.0
    for c, p in zip(counts, probs, strict=True):
        if p == 0:
            continue
        if N * p >= 5:
            cells.append((c, N * p))
        else:
            pooled_obs, pooled_exp = pooled_obs + c, pooled_exp + N * p
    if pooled_exp > 0:
        cells.append((pooled_obs, pooled_exp))
    df = len(cells) - 1
    if df == 0:
        return
    chi2 = sum((o - e) ** 2 / e for o, e in cells)
    # ~ p < 1e-4 for these df (mean df, sd sqrt(2 df)); seeded, so deterministic
    assert chi2 < df + 6 * math.sqrt(2 * df), (chi2, df)


def test_rejects_bad_arguments():
    model = _model("llama")
    ids, mask = _prompts()
    with pytest.raises(ValueError, match="temperature"):
        sample(model, ids, mask, max_new_tokens=2, temperature=0.0, eos_ids=[], pad_id=PAD)
    with pytest.raises(ValueError, match="top_p"):
        sample(model, ids, mask, max_new_tokens=2, top_p=0.0, eos_ids=[], pad_id=PAD)
    with pytest.raises(ValueError, match="max_new_tokens"):
        sample(model, ids, mask, max_new_tokens=0, eos_ids=[], pad_id=PAD)
    with pytest.raises(ValueError, match="not both"):
        sample(
            model, ids, mask, max_new_tokens=2, eos_ids=[], pad_id=PAD,
            generator=torch.Generator(), row_seeds=torch.arange(len(ids)),
        )  # fmt: skip
    with pytest.raises(ValueError, match="row_seeds must have shape"):
        sample(
            model, ids, mask, max_new_tokens=2, eos_ids=[], pad_id=PAD, row_seeds=torch.arange(2)
        )


def test_reused_cache_gives_fresh_results():
    """A second call of the same shape reuses the cache; stale keys of the first call must not leak."""
    model = _model("llama")
    first, mask1 = _prompts(seed=1)
    second, mask2 = _prompts(seed=2)
    kw = dict(max_new_tokens=6, top_k=1, eos_ids=[], pad_id=PAD)
    sample(model, first, mask1, **kw)
    dec = decode._DECODERS[model]
    got = sample(model, second, mask2, **kw)
    assert decode._DECODERS[model] is dec
    ref = model.generate(
        input_ids=second, attention_mask=mask2, do_sample=False, max_new_tokens=6, pad_token_id=PAD
    )[:, second.shape[1] :]
    assert got.tolist() == ref.tolist()
    # wider left padding only adds masked slots: the same tokens
    wide = torch.nn.functional.pad(second, (7, 0), value=PAD)
    wide_mask = torch.nn.functional.pad(mask2, (7, 0), value=0)
    assert sample(model, wide, wide_mask, **kw).tolist() == ref.tolist()


def test_eager_steps_do_not_pad_to_the_bucket():
    """An eager decoder's cache covers the batch's prompts and the new tokens, not the bucket: the
    bucket only fixes a compiled step's shape (padding is work)."""
    model = _model("llama")
    ids, mask = _prompts(P=9)
    kw = dict(max_new_tokens=3, top_k=1, eos_ids=[], pad_id=PAD)
    got = sample(model, ids, mask, prompt_bucket=64, **kw)
    assert decode._DECODERS[model].L == 9 + 3
    assert got.tolist() == sample(model, ids, mask, prompt_bucket=1, **kw).tolist()


def test_decoder_cache_does_not_keep_model_alive():
    import gc
    import weakref

    model = _model("llama")
    ids, mask = _prompts()
    sample(model, ids, mask, max_new_tokens=2, top_k=1, eos_ids=[], pad_id=PAD)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


# --------------------------------------------------------------------------------------------------
# counter-based noise (row_seeds)

_M64 = (1 << 64) - 1


def _splitmix64_outputs(state: int, n: int) -> list[int]:
    """The first n outputs of SplitMix64 started at ``state``, in Python integers (Steele et al.)."""
    out = []
    for _ in range(n):
        state = (state + 0x9E3779B97F4A7C15) & _M64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        out.append(z ^ (z >> 31))
    return out


def _reference_bits(seed: int, t: int, V: int) -> list[int]:
    """counter_bits' definition: key = splitmix64(splitmix64(seed) ^ t), then V outputs from key."""
    key = _splitmix64_outputs(_splitmix64_outputs(seed & _M64, 1)[0] ^ t, 1)[0]
    return _splitmix64_outputs(key, V)


def test_reference_splitmix64_matches_published_values():
    # Rosetta Code "Pseudo-random numbers/Splitmix64", seed 1234567
    assert _splitmix64_outputs(1234567, 5) == [
        6457827717110365317,
        3203168211198807973,
        9817491932198370423,
        4593380528125082431,
        16408922859458223821,
    ]


def test_counter_bits_match_python_integers():
    """int64 tensor arithmetic (wrapping * and +, masked >>) gives SplitMix64's exact bits."""
    seeds = [0, 1, 1234, 2**32 - 1, 2**62 + 12345, -1, -(2**63), 2**63 - 1]
    for t in (0, 1, 7, 10_000):
        got = decode.counter_bits(torch.tensor(seeds), torch.tensor(t), torch.arange(37))
        for b, seed in enumerate(seeds):
            assert [x & _M64 for x in got[b].tolist()] == _reference_bits(seed, t, 37), (seed, t)


def test_counter_noise_is_exact_inversion_of_the_bits():
    """E = −log(1 − U), U = (bits >> 1) / 2^63 rounded to float32, from Python integers in float64.
    float32 U keeps its relative precision at every scale, so small E (which decide whether unlikely
    tokens win) are exact to float32 rounding; large E inherit U's spacing 2^-24 near 1."""
    seeds, t, V = torch.tensor([3, 99]), 5, 4096
    got = decode.counter_noise(seeds, t, torch.arange(V)).double()
    for b, seed in enumerate(seeds.tolist()):
        u = torch.tensor(
            [(x >> 1) / 2.0**63 for x in _reference_bits(seed, t, V)], dtype=torch.float64
        )
        exact = -torch.log1p(-u.clamp(1e-30, 1 - 2.0**-24))
        u32 = u.float().double().clamp(1e-30, 1 - 2.0**-24)
        torch.testing.assert_close(got[b], -torch.log1p(-u32), rtol=1e-6, atol=0)
        small = exact < 1
        torch.testing.assert_close(got[b][small], exact[small], rtol=3e-7, atol=0)
    assert float(got.min()) < 1e-3  # small values occur and were compared at relative precision


def test_counter_noise_is_exponential():
    """Kolmogorov–Smirnov against the Exp(1) CDF over 2^18 draws across rows, steps and tokens."""
    B, V = 64, 1024
    vocab = torch.arange(V)
    draws = torch.cat(
        [decode.counter_noise(torch.arange(B) * 1_000_003, t, vocab).flatten() for t in range(4)]
    ).double()
    x, _ = torch.sort(draws)
    n = len(x)
    cdf = 1 - torch.exp(-x)
    d = max(
        float((torch.arange(1, n + 1) / n - cdf).max()), float((cdf - torch.arange(n) / n).max())
    )
    assert d < 1.95 / math.sqrt(n) * 1.5, d  # ~ p < 1e-4 (K-S critical value 1.95/sqrt n at 1e-3)
    assert abs(float(draws.mean()) - 1) < 6 / math.sqrt(n)  # sd of the mean of Exp(1): 1/sqrt n
    # distinct (row, step) pairs are not copies of each other
    a = decode.counter_noise(torch.tensor([5, 6]), 0, vocab)
    assert not torch.equal(a[0], a[1])
    assert not torch.equal(a[0], decode.counter_noise(torch.tensor([5]), 1, vocab)[0])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_counter_noise_draws_follow_softmax(temperature):
    """Tokens drawn with counter noise over many steps of one row and over many rows of one step
    have the frequencies of softmax(logits / T), computed in plain Python."""
    logits = [2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, 0.2]
    V, N = len(logits), 20_000
    w = [math.exp(x / temperature) for x in logits]
    probs = [x / sum(w) for x in w]
    lg = torch.tensor(logits).expand(N, -1)
    vocab = torch.arange(V)
    along_steps = decode.counter_noise(torch.full((N,), 42), torch.arange(N), vocab)  # t = 0 … N−1
    across_rows = decode.counter_noise(torch.arange(N) * 2654435761, 3, vocab)
    for noise in (along_steps, across_rows):
        tok = decode.draw(lg, noise, temperature, 0, 1.0)
        counts = torch.bincount(tok, minlength=V).tolist()
        cells = [(c, N * p) for c, p in zip(counts, probs, strict=True)]
        assert all(e >= 5 for _, e in cells)
        chi2 = sum((o - e) ** 2 / e for o, e in cells)
        df = V - 1
        assert chi2 < df + 6 * math.sqrt(2 * df), (chi2, counts)


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (5, 1.0), (0, 0.6), (8, 0.8), (1, 1.0)])
def test_draw_counter_equals_draw_with_the_full_noise(top_k, top_p):
    """The top-k path (noise for k candidates only) picks the token the full (B, V) noise picks."""
    B, V = 256, 40
    logits = torch.randn(B, V, generator=torch.Generator().manual_seed(0)) * 2
    seeds, t = torch.arange(B) * 31 + 5, torch.tensor(9)
    full = decode.draw(logits, decode.counter_noise(seeds, t, torch.arange(V)), 0.9, top_k, top_p)
    got = decode.draw_counter(logits, seeds, t, 0.9, top_k, top_p)
    assert torch.equal(got, full)
    assert len(set(got.tolist())) > (1 if top_k == 1 else 5)  # the draws vary with the row


def _padded(rows: torch.Tensor, width: int) -> list[list[int]]:
    return torch.nn.functional.pad(rows, (0, width - rows.shape[1]), value=PAD).tolist()


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (10, 0.9)])
def test_row_seeded_samples_do_not_depend_on_the_batch(top_k, top_p):
    """Each row's response is a function of its prompt and seed: alone, reordered, among other rows,
    behind wider or narrower padding, it is the same."""
    model = _model("llama")
    ids, mask = _prompts(B=4)
    seeds = torch.tensor([11, 22, 33, 2**40 + 5])
    N = 10
    kw = dict(
        max_new_tokens=N, temperature=1.0, top_k=top_k, top_p=top_p, eos_ids=[EOS], pad_id=PAD
    )
    full = _padded(sample(model, ids, mask, row_seeds=seeds, **kw), N)
    # reversed order, and no bucket padding
    rev = sample(model, ids.flip(0), mask.flip(0), row_seeds=seeds.flip(0), prompt_bucket=1, **kw)
    assert _padded(rev, N)[::-1] == full
    # each row alone, its prompt unpadded
    for b in range(4):
        row = ids[b, mask[b].bool()][None]
        alone = sample(model, row, torch.ones_like(row), row_seeds=seeds[b : b + 1], **kw)
        assert _padded(alone, N)[0] == full[b], b
    # among 4 other prompts (other seeds), interleaved, with a longer padded width
    other, other_mask = _prompts(B=4, P=13, seed=5)
    mixed_ids = torch.cat([torch.nn.functional.pad(ids, (4, 0), value=PAD), other])[
        [4, 0, 5, 1, 6, 2, 7, 3]
    ]
    mixed_mask = torch.cat([torch.nn.functional.pad(mask, (4, 0)), other_mask])[
        [4, 0, 5, 1, 6, 2, 7, 3]
    ]
    mixed_seeds = torch.cat([seeds, torch.tensor([1, 2, 3, 4])])[[4, 0, 5, 1, 6, 2, 7, 3]]
    mixed = _padded(sample(model, mixed_ids, mixed_mask, row_seeds=mixed_seeds, **kw), N)
    assert mixed[1::2] == full
    # not trivially true: the rows were sampled (not greedy) and the seed matters
    greedy = _padded(
        sample(model, ids, mask, max_new_tokens=N, top_k=1, eos_ids=[EOS], pad_id=PAD), N
    )
    assert greedy != full
    same_prompt = sample(
        model, ids[:1].expand(4, -1), mask[:1].expand(4, -1), row_seeds=seeds, **kw
    )
    assert len({tuple(r) for r in _padded(same_prompt, N)}) > 1
    assert _padded(same_prompt, N)[0] == full[0]


def test_greedy_ignores_row_seeds():
    model = _model("gemma")
    ids, mask = _prompts()
    kw = dict(max_new_tokens=8, top_k=1, eos_ids=[], pad_id=PAD)
    assert torch.equal(
        sample(model, ids, mask, row_seeds=torch.tensor([1, 2, 3, 4]), **kw),
        sample(model, ids, mask, **kw),
    )


@pytest.mark.cuda
@pytest.mark.parametrize("top_k", [0, 10])
def test_compiled_step_draws_the_eager_tokens_with_row_seeds(top_k):
    """Under torch.compile the counter noise is fused into the step's graph: same bits, same tokens."""
    model = _model("llama").cuda()
    ids, mask = _prompts()
    kw = dict(max_new_tokens=8, temperature=1.0, top_k=top_k, eos_ids=[EOS], pad_id=PAD)
    seeds = torch.tensor([5, 6, 7, 2**50], device="cuda")
    eager = sample(model, ids.cuda(), mask.cuda(), row_seeds=seeds, **kw)
    compiled = sample(model, ids.cuda(), mask.cuda(), row_seeds=seeds, compile=True, **kw)
    assert torch.equal(eager, compiled)
    bits = decode.counter_bits(
        seeds, torch.tensor(3, device="cuda"), torch.arange(37, device="cuda")
    )
    for b, seed in enumerate(seeds.tolist()):
        assert [x & _M64 for x in bits[b].tolist()] == _reference_bits(seed, 3, 37)


def test_generator_noise_is_not_on_a_float32_grid():
    """Small Exp(1) draws must not sit on the 2^-24 grid of a float32 uniform: there, E = 0 (or
    2^-24) makes a token win whatever its probability (once per ~2^24 / V steps)."""
    from marlhf.models.decode import _exp_noise

    e = _exp_noise((1 << 22,), "cpu", torch.Generator().manual_seed(0)).double()
    small = e[e < 1e-4]  # ~420 values; E ≈ U there
    assert small.numel() > 100
    assert bool((small > 0).all())
    k = small * 2.0**24
    distance = (k - k.round()).abs()  # ~0 on the float32 grid, ~U(0, 0.5) off it
    assert distance.mean().item() > 0.15


def _full_forward_stats(model, ids, mask, out, temperature):
    """log-probs and entropies of ``out``'s tokens by one forward pass over prompt ⧺ response
    (the independent reference: no cache), (B, A) each, with the row's valid-token mask."""
    from marlhf.models.logprobs import entropy_from_logits, token_logprobs

    B, P = ids.shape
    seq = torch.cat([ids, out], 1)
    valid = torch.cat([mask.bool(), torch.ones_like(out, dtype=torch.bool)], 1)
    positions = (valid.long().cumsum(1) - 1).clamp_min(0)
    with torch.no_grad():
        logits = model(input_ids=seq, attention_mask=valid.long(), position_ids=positions).logits
    sel = logits[:, P - 1 : -1] / temperature
    is_eos = out == EOS
    keep = ~((torch.cumsum(is_eos.long(), 1) - is_eos.long()) > 0)
    return token_logprobs(sel, out), entropy_from_logits(sel), keep


@pytest.mark.parametrize("arch", ["llama", "gemma"])
@pytest.mark.parametrize("top_k", [0, 5])
def test_recorded_logprobs_equal_a_forward_pass(arch, top_k):
    """`return_logprobs`: each sampled token's log-probability and the entropy under the unfiltered
    softmax(logits / T), as a full forward pass scores them: the first PPO ratio is 1."""
    model = _model(arch)
    ids, mask = _prompts(B=6)
    seeds = torch.arange(6) + 11
    out, logp, ent = sample(
        model, ids, mask, max_new_tokens=12, temperature=0.7, top_k=top_k, eos_ids=[EOS],
        pad_id=PAD, row_seeds=seeds, return_logprobs=True,
    )  # fmt: skip
    plain = sample(
        model, ids, mask, max_new_tokens=12, temperature=0.7, top_k=top_k, eos_ids=[EOS],
        pad_id=PAD, row_seeds=seeds,
    )  # fmt: skip
    assert torch.equal(out, plain)  # recording changes no draw
    ref_logp, ref_ent, keep = _full_forward_stats(model, ids, mask, out, 0.7)
    assert logp.shape == out.shape == ent.shape
    ratio = torch.exp(ref_logp - logp)[keep]
    assert (ratio - 1).abs().max() < 1e-5
    assert torch.allclose(ent[keep], ref_ent[keep], atol=1e-5)
    assert (logp[~keep] == 0).all() and (ent[~keep] == 0).all()


def test_windowed_attention_equals_the_full_cache(monkeypatch):
    """Eager steps attend over the written cache slots only; with the window off (the compiled
    path's full shape) the greedy tokens and recorded log-probs are the same."""
    model = _model("llama")
    ids, mask = _prompts(B=5)
    kw = dict(max_new_tokens=14, top_k=1, eos_ids=[EOS], pad_id=PAD, return_logprobs=True)
    windowed = sample(model, ids, mask, **kw)
    decode.release_decoders()
    monkeypatch.setattr(decode._Decoder, "set_window", lambda self, n: None)
    full = sample(model, ids, mask, **kw)
    assert torch.equal(windowed[0], full[0])
    assert torch.allclose(windowed[1], full[1], atol=1e-5)
    decode.release_decoders()


def _family(arch: str):
    """A small model of each family the lean step covers (Qwen2 with its q/k/v biases)."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if arch in ("llama", "gemma"):
        return _model(arch)
    torch.manual_seed(0)
    common = dict(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=PAD, eos_token_id=EOS,
        bos_token_id=2, initializer_range=0.2,
    )  # fmt: skip
    if arch == "mistral":
        return MistralForCausalLM(MistralConfig(**common, sliding_window=None)).eval()
    model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False)).eval()
    with torch.no_grad():  # non-zero biases, so a step that dropped them would show
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


@pytest.mark.parametrize("arch", ["llama", "gemma", "mistral", "qwen2"])
def test_lean_step_equals_the_models_forward(arch, monkeypatch):
    """The eager step's `_lean_logits` against the model's own forward (lean_parts -> None): the
    same sampled tokens and recorded log-probs, temperature sampling from the whole vocabulary."""
    model = _family(arch)
    assert decode.lean_parts(model) is not None
    ids, mask = _prompts(B=5)
    kw = dict(
        max_new_tokens=16, temperature=1.0, top_k=0, eos_ids=[EOS], pad_id=PAD,
        row_seeds=torch.arange(5) + 3, return_logprobs=True,
    )  # fmt: skip
    lean = sample(model, ids, mask, **kw)
    decode.release_decoders()
    monkeypatch.setattr(decode, "lean_parts", lambda m: None)
    full = sample(model, ids, mask, **kw)
    decode.release_decoders()
    assert torch.equal(lean[0], full[0])
    torch.testing.assert_close(lean[1], full[1], rtol=0, atol=1e-5)
    torch.testing.assert_close(lean[2], full[2], rtol=0, atol=1e-5)


def test_lean_step_declines_unknown_layouts():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2))
    assert decode.lean_parts(gpt2) is None


def test_decode_steps_draw_from_the_decoders_vocabulary_buffer(monkeypatch):
    """Compiled steps must not make ``arange(V)`` inside the graph (inductor turns it into the
    kernel's int32 loop index, and Triton refuses its product with SplitMix64's 64-bit increment:
    the full-vocabulary draw failed to compile on CUDA). Every decode step passes the decoder's
    one ``arange(V)`` buffer to `draw_counter`; the tokens are those of a fresh ``arange``."""
    model = _model("llama")
    ids, mask = _prompts()
    kw = dict(max_new_tokens=6, temperature=1.0, top_k=0, eos_ids=[], pad_id=PAD)
    seeds = torch.tensor([5, 6, 7, 2**50])
    fresh = sample(model, ids, mask, row_seeds=seeds, **kw)
    seen = []
    real = decode.draw_counter

    def spy(logits, row_seeds, t, temperature, top_k, top_p, vocab=None):
        seen.append(vocab)
        return real(logits, row_seeds, t, temperature, top_k, top_p, vocab)

    monkeypatch.setattr(decode, "draw_counter", spy)
    assert torch.equal(sample(model, ids, mask, row_seeds=seeds, **kw), fresh)
    steps = seen[1:]  # the first token is drawn after the prefill, outside the step
    assert len(steps) == 5 and all(v is steps[0] for v in steps)
    assert torch.equal(steps[0], torch.arange(64))
