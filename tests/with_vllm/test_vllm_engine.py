"""The vLLM engine (`marlhf.models.vllm_engine`) against the static decoder and the trainer's log-probs, on
the shipped ``tiny-base`` in float32 on CPU. One engine for the module (T = 0.7; each test uses its
own top-k / top-p). Runs where vLLM is installed (``make test-vllm``: ``.venv-vllm``).

Same distribution. For one PPO prompt of the synthetic task, N = 2000 responses of L = 6 tokens
from each sampler (distinct row seeds), T = 1.5, top-k 20, top-p 0.9. The tokens at each position t
have the same marginal distribution under both samplers when they sample the same model the same
way (a row that has ended counts as "ended"), so each position gets a chi-square test of homogeneity
of the two samples' counts. The nucleus leaves one first token (both samples check it), so the
second token's exact distribution, softmax(filter(logits / T)) after it, is known: each sample also
gets a chi-square goodness-of-fit test against it. Categories whose expected count is below 5 are
merged into one. The L + 2 tests are Bonferroni corrected to a family-wise false-failure rate of
1e-3: when the two samplers agree, a draw of seeds fails with probability at most 1e-3 (the seeds
are fixed, so the test itself is deterministic; three other seed draws of the static decoder
against itself gave smallest p-values 0.035, 0.11, 0.39). Its power on the same data: the static
decoder at T = 1.7, or with top-p 1, is rejected (p < 1e-6; T = 1.6 gave 1e-4, at the threshold
1.25e-4).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")

from marlhf.models.decode import filter_logits, sample  # noqa: E402
from marlhf.models.logprobs import token_logprobs  # noqa: E402
from marlhf.models.sequences import response_mask  # noqa: E402
from marlhf.models.vllm_engine import VLLMEngine, VLLMError, check_model  # noqa: E402

T = 1.5  # the tiny base is peaked: at 0.7 most positions have one likely token
N = 2000  # responses per sampler in the distribution test
L = 6  # new tokens per response there
ALPHA = 1e-3  # family-wise false-failure rate of the distribution test
# measured on this CPU (fp32): max |vLLM's recorded log-prob − the trainer's| = 2.6e-6 over the
# 12000 sampled tokens of the distribution test (the static decoder's record: 0); the engine's
# prompt log-probs against the trainer's 1.2e-5, after a weight sync 5.7e-6 (LoRA merged: 6.7e-6)
LOGPROB_TOL = 5e-5
PROMPT = (  # a PPO prompt of the bundled synthetic task
    "POST\nSubreddit: r/jobs\nI have been thinking about this a lot. This has been bothering me "
    "for a while. Sorry for formatting, I am on mobile. We have known each other for five years. "
    "Sorry for the long post. To make it worse, my intern moved to another city two days ago. So my "
    "boss broke a promise. My friend sold my bike this morning. Yesterday, my client skipped the "
    "exam. I usually try to stay calm about things.\nTL;DR: "
)


@pytest.fixture(scope="module")
def base():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from marlhf.models.load import resolve_model_path

    path = resolve_model_path("tiny-base")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, tok, model


@pytest.fixture(scope="module")
def engine(base):
    path = base[0]
    eng = VLLMEngine(path, temperature=T, max_model_len=160, max_num_seqs=512, seed=0)
    yield eng
    eng.close()


def _prompt(tok, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([tok(PROMPT)["input_ids"]] * n)
    return ids, torch.ones_like(ids)


def _trainer_logprobs(model, prompt: torch.Tensor, response: torch.Tensor) -> torch.Tensor:
    """log softmax(logits / T) of each response token under ``model`` (the trainer's formula),
    (B, A), for prompts of one length (no padding)."""
    P = prompt.shape[1]
    with torch.no_grad():
        logits = model(torch.cat([prompt, response], 1)).logits[:, P - 1 : -1]
    return token_logprobs(logits, response, temperature=T)


def _categories(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) position t's outcome: the token, or -1 once the response has ended."""
    return torch.where(mask, tokens, -1)


def _chi2_sf(x: float, df: int) -> float:
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(x / 2.0)))


def _merged(expected: dict, *counts: dict) -> tuple[list[float], list[list[float]]]:
    """Categories with expected count >= 5 kept, the rest merged into one."""
    keys = [k for k, e in expected.items() if e >= 5]
    rest = [k for k in expected if k not in keys]
    exp = [expected[k] for k in keys] + ([sum(expected[k] for k in rest)] if rest else [])
    obs = [
        [c.get(k, 0) for k in keys] + ([sum(c.get(k, 0) for k in rest)] if rest else [])
        for c in counts
    ]
    return exp, obs


def homogeneity_p(a: torch.Tensor, b: torch.Tensor) -> float:
    """p-value of the chi-square test that samples ``a`` and ``b`` (equal sizes) come from one
    distribution over their categories."""
    ca, cb = (
        dict(zip(*[x.tolist() for x in s.unique(return_counts=True)], strict=True)) for s in (a, b)
    )
    expected = {k: (ca.get(k, 0) + cb.get(k, 0)) / 2 for k in set(ca) | set(cb)}
    exp, (oa, ob) = _merged(expected, ca, cb)
    if len(exp) < 2:
        return 1.0
    stat = sum((o - e) ** 2 / e for o, e in zip(oa + ob, exp + exp, strict=True))
    return _chi2_sf(stat, len(exp) - 1)


def fit_p(a: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of the chi-square goodness of fit of sample ``a`` (token ids) to ``probs`` (V,)."""
    n = a.numel()
    ca = dict(zip(*[x.tolist() for x in a.unique(return_counts=True)], strict=True))
    expected = {k: n * float(p) for k, p in enumerate(probs) if p > 0}
    exp, (oa,) = _merged(expected, ca)
    stat = sum((o - e) ** 2 / e for o, e in zip(oa, exp, strict=True))
    return _chi2_sf(stat, len(exp) - 1)


def _static(model, ids, mask, eos, pad, seeds, temperature=T, top_k=20, top_p=0.9):
    return sample(
        model, ids, mask, max_new_tokens=L, temperature=temperature, top_k=top_k, top_p=top_p,
        eos_ids=eos, pad_id=pad, row_seeds=seeds, return_logprobs=True,
    )  # fmt: skip


def _min_p(x: tuple, y: tuple, probs1: torch.Tensor | None) -> float:
    """The smallest p-value of the family: homogeneity at each position (+ fit at position 1)."""
    (ra, ma), (rb, mb) = x, y
    ps = [
        homogeneity_p(_categories(ra[:, t], ma[:, t]), _categories(rb[:, t], mb[:, t]))
        for t in range(L)
    ]
    if probs1 is not None:
        ps += [fit_p(ra[:, 1], probs1), fit_p(rb[:, 1], probs1)]
    return min(ps)


def _padded(r: torch.Tensor, width: int, pad: int) -> torch.Tensor:
    return torch.nn.functional.pad(r, (0, width - r.shape[1]), value=pad)


def test_same_distribution_as_the_static_decoder_and_the_trainers_logprobs(base, engine):
    _, tok, model = base
    eos, pad = [tok.eos_token_id], tok.pad_token_id
    ids, mask = _prompt(tok, N)
    vl_resp, vl_logp = engine.sample(
        ids, mask, max_new_tokens=L, top_k=20, top_p=0.9, eos_ids=eos, pad_id=pad,
        row_seeds=torch.arange(N) + 10_000,
    )  # fmt: skip
    st_resp, st_logp, _ = _static(model, ids, mask, eos, pad, torch.arange(N) + 20_000)
    vl_resp, st_resp = (_padded(r, L, pad) for r in (vl_resp, st_resp))
    vl_mask, _ = response_mask(vl_resp, eos)
    st_mask, _ = response_mask(st_resp, eos)
    first = vl_resp[0, :1]
    assert (vl_resp[:, 0] == first).all() and (st_resp[:, 0] == first).all()  # the nucleus of one
    with torch.no_grad():
        second = model(torch.cat([ids[:1], first[None]], 1)).logits[0, -1].float() / T
    probs1 = torch.softmax(filter_logits(second[None], 20, 0.9), -1)[0]
    family = L + 2
    p = _min_p((vl_resp, vl_mask), (st_resp, st_mask), probs1)
    assert p > ALPHA / family, p
    # power on the same prompts: a different temperature or no nucleus is rejected
    for kw in (dict(temperature=1.7), dict(top_p=1.0)):
        alt, _, _ = _static(model, ids, mask, eos, pad, torch.arange(N) + 20_000, **kw)
        alt = _padded(alt, L, pad)
        q = _min_p((vl_resp, vl_mask), (alt, response_mask(alt, eos)[0]), None)
        assert q < ALPHA / family, (kw, q)
    # log-probs: the engine's record is the trainer's log softmax(logits / T), before top-k/top-p
    trainer = _trainer_logprobs(model, ids, vl_resp.masked_fill(~vl_mask, pad))
    diff = (vl_logp - trainer).abs()[vl_mask]
    assert float(diff.max()) < LOGPROB_TOL, float(diff.max())
    static_diff = (st_logp - _trainer_logprobs(model, ids, st_resp))[st_mask[:, : st_logp.shape[1]]]
    assert float(static_diff.abs().max()) < LOGPROB_TOL


def test_rows_depend_on_their_seed_only(base, engine):
    _, tok, _ = base
    kw = dict(
        max_new_tokens=8, top_k=0, top_p=1.0, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id
    )
    short = torch.tensor(tok("TL;DR:")["input_ids"])
    long = torch.tensor(tok(PROMPT)["input_ids"])
    # a batch of two different prompts, left-padded, and each row alone, in the other order
    ids = torch.full((2, len(long)), tok.pad_token_id)
    ids[0, -len(short) :], ids[1] = short, long
    mask = ids != tok.pad_token_id
    seeds = torch.tensor([7, 8])
    both, logp = engine.sample(ids, mask, row_seeds=seeds, **kw)
    again, _ = engine.sample(ids, mask, row_seeds=seeds, **kw)
    assert torch.equal(both, again)  # reproducible
    one, _ = engine.sample(long[None], torch.ones(1, len(long)), row_seeds=seeds[1:], **kw)
    zero, _ = engine.sample(short[None], torch.ones(1, len(short)), row_seeds=seeds[:1], **kw)
    assert torch.equal(_padded(one, both.shape[1], tok.pad_token_id)[0], both[1])
    assert torch.equal(_padded(zero, both.shape[1], tok.pad_token_id)[0], both[0])
    other, _ = engine.sample(ids, mask, row_seeds=torch.tensor([7, 9]), **kw)
    assert torch.equal(other[0], both[0]) and not torch.equal(other[1], both[1])


def test_stop_tokens_max_new_tokens_and_the_no_eos_path(base, engine):
    _, tok, _ = base
    ids, mask = _prompt(tok, 64)
    pad, eos, M = tok.pad_token_id, tok.eos_token_id, 8
    kw = dict(max_new_tokens=M, top_k=0, top_p=1.0, pad_id=pad, row_seeds=torch.arange(64))
    free, _ = engine.sample(ids, mask, eos_ids=[eos], **kw)
    n_free = response_mask(free, [eos])[0].sum(1)
    # a second stop token: the one that occurs in closest to half of the responses
    seen = [set(free[b, : n_free[b]].tolist()) - {eos} for b in range(64)]
    counts = torch.bincount(torch.tensor([v for s in seen for v in s]), minlength=tok.vocab_size)
    stop = int((counts.float() - 32).abs().argmin())
    out, logp = engine.sample(ids, mask, eos_ids=[eos, stop], **kw)
    assert out.shape[1] <= M
    action, ends = response_mask(out, [eos, stop])
    n = action.sum(1)
    for b in range(64):
        row = out[b, : n[b]].tolist()
        assert row == free[b, : n[b]].tolist()  # the same draws, up to the first stop token
        if ends[b]:
            assert row[-1] in (eos, stop) and not set(row[:-1]) & {eos, stop}
        else:  # cut at max_new_tokens: no EOS, so --no_eos_penalty applies to it
            assert n[b] == M and not set(row) & {eos, stop}
        assert (out[b, n[b] :] == pad).all() and (logp[b, n[b] :] == 0).all()
    assert (out == stop).any() and (~ends).any()


def test_prompt_beyond_the_engine_context_is_one_line_error(base, engine):
    _, tok, _ = base
    ids = torch.full((1, 160), 5)
    with pytest.raises(VLLMError, match="160 tokens leaves no room .* context of 160 tokens"):
        engine.sample(ids, torch.ones_like(ids), max_new_tokens=4, top_k=0, top_p=1.0,
                      eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)  # fmt: skip


def test_model_checks(base, tmp_path):
    import json

    path = base[0]
    config = json.loads((Path(path) / "config.json").read_text())
    config["architectures"] = ["NoSuchForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(VLLMError, match="cannot serve .* NoSuchForCausalLM.*static or hf"):
        check_model(str(tmp_path), 100, "--max_prompt_seq_len + --max_answer_seq_len")
    with pytest.raises(
        VLLMError, match=r"--max_prompt_seq_len \+ --max_answer_seq_len = 600 tokens"
    ):
        check_model(path, 600, "--max_prompt_seq_len + --max_answer_seq_len")


def _perturbed(model, scale: float = 0.05):
    """A copy of ``model`` with every parameter moved (an update of every weight)."""
    import copy

    new = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(scale * p.abs().mean() * torch.randn(p.shape, generator=g))
    return new


def _engine_vs_trainer(engine, trainer, seqs: torch.Tensor) -> float:
    """max |engine's log-prob − trainer's| over every token of ``seqs`` (B, T) but the first."""
    got = engine.token_logprobs(seqs, torch.full((seqs.shape[0],), seqs.shape[1]))[:, 1:]
    with torch.no_grad():
        logits = trainer(seqs).logits[:, :-1]
    want = token_logprobs(logits, seqs[:, 1:], temperature=T)
    return float((got - want).abs().max())


def test_weight_sync_in_place_plain_and_lora(base, engine):
    """The engine follows the trainer's weights only once they are loaded (every parameter moved,
    tied embeddings included); a peft LoRA model is merged; the engine's storage does not move."""
    from marlhf.stages.ppo.sampler import actor_weights

    _, tok, model = base
    seqs = torch.cat([_prompt(tok, 1)[0], torch.randint(3, 900, (1, 12))], 1).repeat(3, 1)
    seqs[1:, -12:] = torch.randint(3, 900, (2, 12))
    ptrs = engine.llm.apply_model(lambda m: sorted(p.data_ptr() for p in m.parameters()))
    assert _engine_vs_trainer(engine, model, seqs) < LOGPROB_TOL
    moved = _perturbed(model)
    assert _engine_vs_trainer(engine, moved, seqs) > 100 * LOGPROB_TOL  # before the sync
    engine.load_weights(actor_weights(moved, zero3=False))
    assert _engine_vs_trainer(engine, moved, seqs) < LOGPROB_TOL  # after
    assert engine.llm.apply_model(lambda m: sorted(p.data_ptr() for p in m.parameters())) == ptrs
    # LoRA, merged: B != 0 so the adapter changes the policy
    from marlhf.config import ModelConfig
    from marlhf.models.lora import apply_lora

    lora = apply_lora(_perturbed(model, 0.0), ModelConfig(lora_dim=4, lora_module_name="layers."))
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    lora.eval()
    assert _engine_vs_trainer(engine, lora, seqs) > 100 * LOGPROB_TOL
    engine.load_weights(actor_weights(lora, zero3=False))
    assert _engine_vs_trainer(engine, lora, seqs) < LOGPROB_TOL
    engine.load_weights(actor_weights(model, zero3=False))  # the module's engine back as it was
    assert _engine_vs_trainer(engine, model, seqs) < LOGPROB_TOL
