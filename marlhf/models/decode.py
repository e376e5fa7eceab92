"""Static-shape sampling for rollouts: a pre-allocated KV cache, one decode step per token.

Why not ``model.generate``: on a GPU, generate spends most of each decode step in Python and kernel
launches (35–220× above the weights-only memory-bandwidth bound at 0.1–1 B parameters). This loop keeps
every tensor the same shape at every step — the KV cache is allocated once for ``P + max_new_tokens``
positions, the attention mask and positions are computed on the device, the random draw is an input —
so the step can be captured once as a CUDA graph (``torch.compile(mode="reduce-overhead")``) and
replayed.

Layout. Prompts are left-padded ``(B, P)``. Row ``b``'s real tokens get positions ``0 … n_b − 1``
(``n_b`` = its prompt length), and its ``s``-th new token position ``n_b + s``, exactly as ``generate``
computes them from the attention mask; padded slots are masked out of every attention. Responses come
back right-padded ``(B, A)``: ``pad_id`` after each row's first EOS, ``A ≤ max_new_tokens`` (the loop
stops once every row has finished).

Sampling follows ``generate``'s order: logits / temperature → top-k → top-p → draw. The draw is the
exponential race (``argmax_v p_v / E_v`` with ``E_v ~ Exp(1)`` i.i.d. picks ``v`` with probability
``p_v``), with the noise drawn from the caller's ``torch.Generator`` outside the compiled step, so a
seeded run is reproducible whether or not the step is compiled. ``top_k=1`` is greedy (argmax, no noise).

With ``row_seeds`` instead of a generator the noise is counter-based (`counter_noise`): ``E`` for row
``b``, decode step ``t`` and token ``v`` is a hash of ``(seed_b, t, v)``, computed on the device inside
the step. A row then draws the same response whatever other rows share its batch, in any order and
behind any prompt padding (up to the float rounding of the model's own logits), so rollouts split over
data-parallel ranks are those of one process.

Works for models whose attention layers are all full attention and that take a 4-D additive mask
(Llama, Gemma, Mistral without sliding window, Qwen2, …).

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> torch.manual_seed(0) and None
>>> model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32,
...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, pad_token_id=0))
>>> ids = torch.tensor([[0, 5, 6], [7, 8, 9]])  # row 0 left-padded
>>> out = sample(model, ids, (ids != 0).long(), max_new_tokens=4, temperature=0.8, top_k=10,
...              top_p=0.9, eos_ids=[1], pad_id=0, generator=torch.Generator().manual_seed(0))
>>> out.shape[0], out.shape[1] <= 4, out.dtype
(2, True, torch.int64)
"""

from __future__ import annotations

import weakref

import torch

# One decoder (KV cache + compiled step) per model, reused while (B, L, dtype, device) stay the same:
# a PPO run calls `sample` every step, and rebuilding would re-capture the CUDA graph each time.
_DECODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set logits outside the top-k, then outside the top-p nucleus, to −inf.

    logits: (B, V) float, already divided by the temperature. ``top_k=0`` and ``top_p=1`` are off.
    The nucleus is the smallest set of most-probable tokens whose probability (after top-k) reaches
    ``top_p``: a token is kept when the mass of the tokens ranked above it is < ``top_p``; the most
    probable token is always kept. Returns (B, V).

    >>> filter_logits(torch.log(torch.tensor([[0.5, 0.1, 0.3, 0.1]])), top_p=0.7).exp()
    tensor([[0.5000, 0.0000, 0.3000, 0.0000]])
    """
    V = logits.shape[-1]
    if 0 < top_k < V:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_above = torch.cumsum(probs, dim=-1) - probs  # (B, V) mass of better-ranked tokens
        drop_sorted = mass_above >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def draw(
    logits: torch.Tensor,
    noise: torch.Tensor | None,
    temperature: float,
    top_k: int,
    top_p: float,
) -> torch.Tensor:
    """Next tokens from raw logits: (B, V) float → (B,) long.

    ``noise``: (B, V) i.i.d. Exp(1) draws (``None`` for greedy, ``top_k=1``). Computes
    argmax softmax(filter(logits / temperature)) / noise, a sample from the filtered distribution.
    """
    if top_k == 1:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(filter_logits(logits.float() / temperature, top_k, top_p), dim=-1)
    return torch.argmax(probs / noise, dim=-1)


def _exp_noise(shape, device, generator: torch.Generator | None) -> torch.Tensor:
    # Exp(1) by inversion of a uniform, so CPU and CUDA generators behave alike. 1 − U ∈ (0, 1].
    # The uniform is float64 (a 2^-53 grid): with float32's 2^-24 grid, U = 0 (E ≈ 0, a token that
    # wins whatever its probability) came up for some token in ~1.5 % of steps at V = 256k.
    u = torch.rand(shape, device=device, generator=generator, dtype=torch.float64)
    return (-torch.log1p(-u)).clamp_min(1e-300).to(torch.float32)


# Counter-based noise: SplitMix64 (Steele, Lea & Flood 2014) on int64 tensors. torch's int64 + and *
# wrap modulo 2^64 (two's complement) on CPU and CUDA — tests/models/test_decode.py checks this bit for bit
# against Python integers — but its >> is arithmetic, so the shifts mask off the copied sign bits.
_GAMMA = 0x9E3779B97F4A7C15 - (1 << 64)  # SplitMix64's increment (2^64 / golden ratio), as an int64
_MUL1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MUL2 = 0x94D049BB133111EB - (1 << 64)


def _mix64_(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output function, in place on an int64 tensor (a bijection of the 64 bits)."""
    z ^= (z >> 30).bitwise_and_((1 << 34) - 1)  # z ^ (z >>> 30), a logical shift
    z *= _MUL1
    z ^= (z >> 27).bitwise_and_((1 << 37) - 1)
    z *= _MUL2
    z ^= (z >> 31).bitwise_and_((1 << 33) - 1)
    return z


def counter_bits(
    row_seeds: torch.Tensor, t: torch.Tensor | int, tokens: torch.Tensor
) -> torch.Tensor:
    """Random int64 bits of (row, decode step, token), a pure function of (seed_b, t, v).

    row_seeds: (B,) int64 (all 64 bits are used); t: the decode step, an int or a () long tensor;
    tokens: (V,) long (the same tokens for every row, e.g. ``arange(V)``) or (B, K) long (each row's
    own). Returns (B, V) or (B, K) int64. Row b's step-t key is ``k = splitmix64(splitmix64(seed_b)
    ^ t)`` with ``splitmix64(x) = mix64(x + γ)``, and token v's bits are output v of the SplitMix64
    stream started at k: ``mix64(k + (v + 1)·γ)`` (mod 2^64) — one elementwise pass (fused when
    compiled), and any token can be evaluated alone.
    """
    key = _mix64_((_mix64_(row_seeds + _GAMMA) ^ t) + _GAMMA)  # (B,) k
    key += _GAMMA  # output v is mix64(k + γ + v·γ)
    return _mix64_(key[:, None] + tokens * _GAMMA)


def counter_noise(
    row_seeds: torch.Tensor, t: torch.Tensor | int, tokens: torch.Tensor
) -> torch.Tensor:
    """Exp(1) noise of (row b, decode step t, token v), float32, shaped like `counter_bits`.

    The top 63 bits as an integer k give U = k / 2^63 in float32, which keeps 24 significant bits at
    every scale, so small E = −log(1 − U) (the values that pick unlikely tokens) are resolved finely;
    a 24-bit grid ``k / 2^24`` would give E = 0 to one token in 2^24, which then wins whatever its
    probability. U is clamped to [1e-30, 1 − 2^-24]: E ∈ [1e-30, 16.6]; P(E > 16.6) = 6e-8.

    >>> a = counter_noise(torch.tensor([7, 8]), 3, torch.arange(5))
    >>> torch.equal(a[1], counter_noise(torch.tensor([8]), 3, torch.arange(5))[0])  # row 8 alone
    True
    >>> torch.equal(a[:, [4, 1]], counter_noise(torch.tensor([7, 8]), 3, torch.tensor([[4, 1]] * 2)))
    True
    """
    k = (counter_bits(row_seeds, t, tokens) >> 1).bitwise_and_((1 << 63) - 1)
    neg_u = k.float().mul_(-(2.0**-63)).clamp_(-(1.0 - 2.0**-24), -1e-30)  # −U
    return neg_u.log1p_().neg_()


def draw_counter(
    logits: torch.Tensor,
    row_seeds: torch.Tensor,
    t: torch.Tensor | int,
    temperature: float,
    top_k: int,
    top_p: float,
    vocab: torch.Tensor | None = None,
) -> torch.Tensor:
    """`draw` with `counter_noise`: (B, V) float logits → (B,) long, the same token as
    ``draw(logits, counter_noise(row_seeds, t, arange(V)), ...)``. With ``0 < top_k < V`` the noise
    is made for the top-k candidates only, (B, k) instead of (B, V) (tokens tied with the k-th are
    dropped here, kept by `filter_logits`). ``vocab``: ``arange(V)`` made outside a compiled graph
    (the decoder's): inside one, inductor turns an ``arange`` into the kernel's int32 loop index,
    and Triton refuses the product of that index with SplitMix64's 64-bit increment, so the
    compiled full-vocabulary draw (``top_k=0``) reads the tokens from memory instead."""
    V = logits.shape[-1]
    if top_k == 1:
        return torch.argmax(logits, dim=-1)
    x = logits.float() / temperature
    if 0 < top_k < V:
        x, tokens = torch.topk(x, top_k, dim=-1)  # (B, k), best first
        probs = torch.softmax(filter_logits(x, 0, top_p), dim=-1)
        pick = torch.argmax(probs / counter_noise(row_seeds, t, tokens), dim=-1, keepdim=True)
        return tokens.gather(1, pick)[:, 0]
    probs = torch.softmax(filter_logits(x, 0, top_p), dim=-1)
    tokens = vocab if vocab is not None else torch.arange(V, device=logits.device)
    return torch.argmax(probs / counter_noise(row_seeds, t, tokens), dim=-1)


def _check_model(config) -> None:
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        raise ValueError(
            f"marlhf.models.decode supports full-attention models only; layer_types={sorted(set(layer_types))}"
            " (use --generation_backend hf)"
        )


def _window_cache(config, L: int):
    """A ``StaticCache`` for ``L`` positions whose layers honour ``cache.window`` (None: all)."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    class WindowLayer(StaticLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            keys, values = super().update(key_states, value_states, *args, **kwargs)
            n = cache.window
            return (keys, values) if n is None else (keys[:, :, :n], values[:, :, :n])

    cache = StaticCache(config=config, max_cache_len=L)
    cache.layers = [WindowLayer(max_cache_len=L) for _ in cache.layers]
    cache.window = None
    return cache


# decoder families whose one-token step `_lean_logits` reproduces: embed → per layer (norm, q/k/v,
# RoPE, attention over the cache, o_proj, residual, norm, MLP, residual) → norm → LM head
LEAN_MODEL_TYPES = ("gemma", "llama", "mistral", "qwen2")


def lean_parts(model):
    """The modules `_lean_logits` calls, or None when ``model`` is not a plain (un-wrapped)
    causal LM of :data:`LEAN_MODEL_TYPES` with the usual layout (then the step calls the model).

    The eager decode step then skips the model's Python around those modules (output capture,
    attention dispatch, cache plumbing, output records): on a CPU, where a one-token step is
    mostly that overhead, about a third of the model's step time. The modules themselves (norms,
    projections, MLP, rotary embedding, LM head) are the model's own, so LoRA layers, biases and
    rope variants apply as in its forward."""
    inner, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    if getattr(model.config, "model_type", None) not in LEAN_MODEL_TYPES or head is None:
        return None
    needed = ("embed_tokens", "rotary_emb", "layers", "norm")
    if inner is None or not all(hasattr(inner, k) for k in needed):
        return None
    for layer in inner.layers:
        attn = getattr(layer, "self_attn", None)
        if attn is None or hasattr(attn, "q_norm") or not hasattr(attn, "scaling"):
            return None
    return inner, head


def _lean_logits(parts, cache, tokens, positions, mask) -> torch.Tensor:
    """Last-position logits (B, V) of one decode step: the model's decoder layers applied to
    ``tokens`` (B, 1) at ``positions`` (B, 1), attending over ``cache`` under the additive
    ``mask`` (B, 1, 1, n), as the model's own forward computes them (its sdpa path for one query:
    the query heads packed onto their key/value head)."""
    inner, head = parts
    h = inner.embed_tokens(tokens)  # (B, 1, H)
    cos, sin = (x.unsqueeze(1) for x in inner.rotary_emb(h, positions))  # (B, 1, 1, D)
    B = tokens.shape[0]
    for i, layer in enumerate(inner.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        D = attn.head_dim
        q = attn.q_proj(x).view(B, 1, -1, D).transpose(1, 2)  # (B, Hq, 1, D)
        k = attn.k_proj(x).view(B, 1, -1, D).transpose(1, 2)  # (B, Hkv, 1, D)
        v = attn.v_proj(x).view(B, 1, -1, D).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        keys, values = cache.layers[i].update(k, v)  # (B, Hkv, n, D)
        q = q.reshape(B, keys.shape[1], -1, D)  # one query: heads packed onto their kv head
        o = torch.nn.functional.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, dropout_p=0.0, scale=attn.scaling
        )
        o = o.reshape(B, -1, 1, D).transpose(1, 2).reshape(B, 1, -1)
        h = h + attn.o_proj(o)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return head(inner.norm(h))[:, -1, :]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def token_stats(logits: torch.Tensor, tokens: torch.Tensor, temperature: float):
    """log-prob of ``tokens`` and entropy under softmax(logits / temperature), unfiltered (top-k
    and top-p shape the draw, not the policy PPO scores): (B, V), (B,) -> ((B,), (B,)) float32,
    the formulas of `marlhf.models.logprobs.token_logprobs` and `entropy_from_logits`."""
    x = logits.float() / temperature
    lse = torch.logsumexp(x, dim=-1)
    logp = x.gather(1, tokens[:, None])[:, 0] - lse
    probs = torch.exp(x - lse[:, None])
    return logp, lse - (probs * x).sum(-1)


class _Decoder:
    """The static buffers of ``sample`` for one (B, L) shape; ``step`` is the graph-capturable part."""

    def __init__(self, model, B: int, L: int, dtype: torch.dtype, device, compile: bool):
        # the model itself is not kept: `_DECODERS` holds it weakly, and `step` takes it as an argument
        self.cache = _window_cache(model.config, L)
        self.key = (B, L, dtype, torch.device(device), compile)
        self.L = L
        self.neg = torch.finfo(dtype).min
        self.dtype = dtype
        self.kv_valid = torch.ones(B, L, dtype=torch.bool, device=device)  # (B, L)
        self.key_pos = torch.arange(L, device=device)  # (L,)
        self.vocab: torch.Tensor | None = None  # (V,) arange(V), a graph input of the step
        self.compiled = compile
        self.step_fn = (
            torch.compile(self.step, mode="reduce-overhead", fullgraph=False)
            if compile
            else self.step
        )

    @classmethod
    def for_model(cls, model, B: int, L: int, dtype, device, compile: bool) -> _Decoder:
        key = (B, L, dtype, torch.device(device), compile)
        dec = _DECODERS.get(model)
        if dec is None or dec.key != key:
            dec = cls(model, B, L, dtype, device, compile)
            _DECODERS[model] = dec
        else:
            dec.cache.reset()
            dec.kv_valid.fill_(True)
        return dec

    def set_window(self, n: int) -> None:
        """Attend over the first ``n`` cache slots only (eager steps; compiled steps: all L)."""
        self.cache.window = None if self.compiled else min(n, self.L)

    def prefill(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Run the prompts through the model, filling the cache. Returns last-position logits (B, V)."""
        B, P = input_ids.shape
        valid = attention_mask.bool()
        self.kv_valid[:, :P] = valid
        self.set_window(P)
        n = self.L if self.cache.window is None else P
        key_pos, kv_valid = self.key_pos[:n], self.kv_valid[:, :n]
        positions = (valid.long().cumsum(1) - 1).clamp_min(0)  # (B, P)
        q = torch.arange(P, device=input_ids.device)
        # key j visible to query i: j ≤ i and j is a real token; a padded query sees itself only, so
        # no row of the softmax is empty (its output is never read)
        allowed = (key_pos[None, None, :] <= q[None, :, None]) & kv_valid[:, None, :]
        allowed |= key_pos[None, None, :] == q[None, :, None]  # (B, P, n)
        mask = torch.zeros(B, 1, P, n, dtype=self.dtype, device=input_ids.device)
        mask.masked_fill_(~allowed[:, None], self.neg)
        # eager decode steps attend over exactly the written slots: the mask is the padding's
        self.window_mask = torch.zeros(B, self.L, dtype=self.dtype, device=input_ids.device)
        self.window_mask.masked_fill_(~self.kv_valid, self.neg)
        out = model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :]

    def step(
        self,
        model,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cur: torch.Tensor,
        noise: torch.Tensor | None,
        temperature: float,
        top_k: int,
        top_p: float,
        row_seeds: torch.Tensor | None = None,
        t: torch.Tensor | None = None,
        with_stats: bool = False,
        lean=None,
        vocab: torch.Tensor | None = None,
    ):
        """One decode step. tokens, positions: (B, 1) long; cur: () long, the cache slot written now;
        noise: (B, V) or None, or else ``row_seeds`` (B,) long and ``t`` () long, the decode step, for
        `draw_counter` (its noise is made here, inside the compiled graph). Returns (B,) long, or
        with ``with_stats`` the tuple (tokens, log-probs, entropies) (`token_stats`). ``lean``: the
        model's `lean_parts` (eager steps), else the model's forward is called; ``vocab``: (V,)
        long ``arange(V)`` for `draw_counter` (the decoder's buffer)."""
        n = self.cache.window
        if n is not None:  # the written slots 0..cur (n = cur + 1): only padding is masked
            mask = self.window_mask[:, None, None, :n]
        else:
            allowed = self.kv_valid & (self.key_pos <= cur)  # (B, L)
            mask = torch.zeros(allowed.shape, dtype=self.dtype, device=allowed.device)
            mask = mask.masked_fill(~allowed, self.neg)[:, None, None, :]  # (B, 1, 1, L)
        if lean is not None:
            logits = _lean_logits(lean, self.cache, tokens, positions, mask)
        else:
            out = model(
                input_ids=tokens,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=self.cache,
                use_cache=True,
            )
            logits = out.logits[:, -1, :]
        if row_seeds is not None:
            tok = draw_counter(logits, row_seeds, t, temperature, top_k, top_p, vocab)
        else:
            tok = draw(logits, noise, temperature, top_k, top_p)
        return (tok, *token_stats(logits, tok, temperature)) if with_stats else tok


def release_decoders() -> None:
    """Free the KV caches (and compiled steps) kept between ``sample`` calls."""
    _DECODERS.clear()


def _check_args(max_new_tokens, temperature, top_p, top_k, generator, row_seeds, B) -> None:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if row_seeds is not None:
        if generator is not None:
            raise ValueError("sample takes a generator or row_seeds, not both")
        if tuple(row_seeds.shape) != (B,):
            raise ValueError(f"row_seeds must have shape ({B},), got {tuple(row_seeds.shape)}")


def _trim(out: torch.Tensor, eos: torch.Tensor, pad_id: int, stats: list[torch.Tensor]):
    """Responses (B, max_new) -> (B, A): ``pad_id`` after each row's first EOS, cut to the longest
    row (EOS included); ``stats`` (B, max_new) float cut alike, 0 after the EOS."""
    is_eos = torch.isin(out, eos)
    after = (torch.cumsum(is_eos.long(), 1) - is_eos.long()) > 0
    length = int((~after).sum(1).max())
    out = out.masked_fill(after, pad_id)[:, :length]
    return out, [x.masked_fill(after, 0.0)[:, :length] for x in stats]


def sample(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_ids: list[int],
    pad_id: int,
    generator: torch.Generator | None = None,
    row_seeds: torch.Tensor | None = None,
    compile: bool = False,
    stop_check_every: int = 8,
    prompt_bucket: int = 64,
    return_logprobs: bool = False,
    inference_mode: bool = True,
):
    """Sample responses to left-padded prompts with a static KV cache.

    input_ids, attention_mask: (B, P), left-padded (every row's last column is a real token).
    ``top_k=1`` decodes greedily; ``top_k=0``/``top_p=1`` switch those filters off. The noise comes
    from ``generator`` (on the model's device; ``None``: the global RNG), or, with ``row_seeds: (B,)
    int64``, from `counter_noise`: row b's draws are then a function of ``row_seeds[b]``, its prompt and
    the model only, not of the other rows, their order or the padding. ``compile=True`` wraps the decode step in
    ``torch.compile(mode="reduce-overhead")`` (CUDA graphs) on CUDA; elsewhere it is ignored, and the
    eager steps attend over the cache slots written so far only (`_window_cache`) and, for the model
    families of `LEAN_MODEL_TYPES`, call the model's modules directly (`lean_parts`).
    ``inference_mode=False`` runs under ``torch.no_grad`` (for a ZeRO-3 model whose parameters
    it gathers: `marlhf.stages.ppo.scoring.no_grad_mode`).
    Runs under ``torch.inference_mode`` (no autograd bookkeeping per op: ~10 % of an eager CPU
    decode), ``torch.no_grad`` when compiled.
    ``stop_check_every``: steps between checks that every row has finished (each check syncs the host).
    ``prompt_bucket``: compiled steps only: prompts are left-padded further to a multiple of it, so
    batches whose prompt lengths differ a little share one cache shape (and one CUDA graph); pass the
    maximum prompt length to make every call the same shape. Eager steps ignore it: their window
    covers the written slots only, so extra padding would only add masked work (a 160-token bucket
    over 131-token prompts cost 7 % of a CPU rollout). The cache of the last shape stays
    allocated for the next call (``release_decoders()`` frees it).
    Returns response_ids: (B, A) long, A ≤ max_new_tokens, ``pad_id`` after each row's first EOS; with
    ``return_logprobs`` the tuple (response_ids, logprobs, entropy), the last two (B, A) float32: each
    token's log-probability and the entropy of the distribution it was drawn from, softmax(logits /
    temperature) before top-k / top-p (`token_stats`), 0 after the row's EOS.
    """
    B, P = input_ids.shape
    _check_args(max_new_tokens, temperature, top_p, top_k, generator, row_seeds, B)
    _check_model(model.config)
    compile = compile and input_ids.device.type == "cuda"
    with torch.no_grad() if compile or not inference_mode else torch.inference_mode():
        return _sample(
            model, input_ids, attention_mask, max_new_tokens, temperature, top_k, top_p, eos_ids,
            pad_id, generator, row_seeds, compile, stop_check_every, prompt_bucket, return_logprobs,
        )  # fmt: skip


def _sample(
    model, input_ids, attention_mask, max_new_tokens, temperature, top_k, top_p, eos_ids, pad_id,
    generator, row_seeds, compile, stop_check_every, prompt_bucket, return_logprobs,
):  # fmt: skip
    """The body of `sample` (arguments checked, inside the no-grad context)."""
    B, P = input_ids.shape
    device = input_ids.device
    if row_seeds is not None:
        row_seeds = row_seeds.to(device=device, dtype=torch.long)
    if compile and prompt_bucket > 1 and P % prompt_bucket:
        extra = prompt_bucket - P % prompt_bucket
        input_ids = torch.nn.functional.pad(input_ids, (extra, 0), value=pad_id)
        attention_mask = torch.nn.functional.pad(attention_mask, (extra, 0), value=0)
        P += extra
    was_training = model.training
    model.eval()
    dtype = next(model.parameters()).dtype
    dec = _Decoder.for_model(model, B, P + max_new_tokens, dtype, device, compile)
    noisy = top_k != 1 and row_seeds is None  # the noise is drawn here (else greedy or in `step`)
    lean = None if compile else lean_parts(model)  # compiled steps trace the model's forward
    eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long, device=device)
    out = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)
    stats = [torch.zeros(B, max_new_tokens, device=device) for _ in range(2 * return_logprobs)]
    try:
        logits = dec.prefill(model, input_ids, attention_mask).float()  # (B, V)
        if dec.vocab is None or dec.vocab.numel() != logits.shape[-1]:
            dec.vocab = torch.arange(logits.shape[-1], device=device)
        noise = _exp_noise(logits.shape, device, generator) if noisy else None
        if row_seeds is not None:
            tok = draw_counter(logits, row_seeds, 0, temperature, top_k, top_p)  # (B,)
        else:
            tok = draw(logits, noise, temperature, top_k, top_p)
        out[:, 0] = tok
        for x, v in zip(stats, token_stats(logits, tok, temperature), strict=False):
            x[:, 0] = v
        done = torch.isin(tok, eos)  # (B,)
        positions = attention_mask.long().sum(1, keepdim=True)  # (B, 1) position of the new token
        cur = torch.tensor(P, device=device)
        t = torch.tensor(1, device=device)  # the decode step, the counter of `counter_noise`
        for s in range(1, max_new_tokens):
            if s % stop_check_every == 0 and bool(done.all()):
                break
            dec.set_window(P + s)
            noise = _exp_noise(logits.shape, device, generator) if noisy else None
            res = dec.step_fn(
                model, tok[:, None], positions, cur, noise, temperature, top_k, top_p,
                row_seeds, t, return_logprobs, lean, dec.vocab,
            )  # fmt: skip
            nxt, new = (res[0], res[1:]) if return_logprobs else (res, ())
            # a CUDA-graph output buffer is overwritten by the next replay: `where` copies it
            tok = torch.where(done, pad_id, nxt)
            out[:, s] = tok
            for x, v in zip(stats, new, strict=True):
                x[:, s] = v
            done = done | torch.isin(tok, eos)
            positions, cur, t = positions + 1, cur + 1, t + 1
    finally:
        if was_training:
            model.train()
    out, stats = _trim(out, eos, pad_id, stats)
    return (out, *stats) if return_logprobs else out
