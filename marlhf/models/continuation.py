"""Continuing conversations with the static-KV-cache decoder (:mod:`marlhf.models.decode`): one KV
cache holds every row's conversation, and each turn reads only the row's new tokens.

A turn of the rows named (the others have ended and are dropped from the batch for good):

1. **prefill**: each row's *pending* tokens, those it has that the cache does not (its prompt at
   the first turn; later the last token of its previous action, which was sampled but never fed,
   and the context the caller appends after it) are left-padded to the longest and written at the
   cache's next slots, every row at the same slots;
2. **decode**: one token per step for every row, as :func:`marlhf.models.decode.sample` draws it
   (counter-based noise from the row's seed of this turn and the step, the same log-probs and
   entropies); a row stops after its first EOS or at its own budget of new tokens.

Layout. The cache has ``L`` slots shared by the rows; ``valid`` ``(B, L)`` marks the slots that
hold a row's token: the prefill's left padding and the slots a row writes after it has stopped
are invalid and masked out of every attention. A token's position is its index in the row's
conversation (the count of the row's valid slots before it), so the keys, with their rotary
embedding applied when written, are those of the conversation read at once, and attention does
not depend on where a slot lies. When the next turn does not fit, the cache is compacted (each
row's valid slots moved to its front, in order), and grown only if that is not enough.

The decode steps are eager (on a CPU the lean step of :func:`marlhf.models.decode.lean_parts`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from marlhf.models.decode import (
    _check_model,
    _lean_logits,
    _window_cache,
    draw_counter,
    lean_parts,
    token_stats,
)

SLOT_ROUND = 64  # cache slots are allocated in multiples of this


def _round_up(n: int) -> int:
    return -(-n // SLOT_ROUND) * SLOT_ROUND


class ContinuedDecoder:
    """The KV cache of ``rows`` conversations of the causal LM ``model`` (see the module doc).

    ``max_len``: the most tokens of one conversation (the cache starts with that many slots);
    ``inference_mode=False`` runs under ``torch.no_grad`` (a ZeRO-3 model whose parameters the
    caller gathers)."""

    def __init__(self, model, rows: int, max_len: int, inference_mode: bool = True):
        _check_model(model.config)
        if max_len < 2:
            raise ValueError(f"max_len must be >= 2, got {max_len}")
        param = next(model.parameters())
        self.model, self.device, self.dtype = model, param.device, param.dtype
        self.neg = torch.finfo(self.dtype).min
        self.inference_mode = inference_mode
        self.lean = lean_parts(model)
        self.L = _round_up(max_len)
        self.index: list[int | None] = list(range(rows))  # row -> batch index (None: dropped)
        self.batch_rows = list(range(rows))  # batch index -> row
        self.pending: list[list[int]] = [[] for _ in range(rows)]
        self.cache = _window_cache(model.config, self.L)
        self.valid = torch.zeros(rows, self.L, dtype=torch.bool, device=self.device)  # (B, L)
        self.length = torch.zeros(rows, dtype=torch.long, device=self.device)  # (B,) positions
        self.cur = 0  # slots written

    # ----------------------------------------------------------------------------------------
    # the cache's slots and rows

    def _layers(self):
        return [x for x in self.cache.layers if getattr(x, "is_initialized", False)]

    def _keep_rows(self, keep: list[int]) -> None:
        """Keep the batch rows ``keep`` (increasing batch indices), dropping the others."""
        if len(keep) == len(self.batch_rows):
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        for layer in self._layers():
            layer.keys, layer.values = layer.keys[idx], layer.values[idx]
            layer.batch_size = len(keep)
        self.valid, self.length = self.valid[idx], self.length[idx]
        for r in self.batch_rows:
            self.index[r] = None
        self.batch_rows = [self.batch_rows[b] for b in keep]
        for b, r in enumerate(self.batch_rows):
            self.index[r] = b

    def _set_cur(self, cur: int) -> None:
        self.cur = cur
        for layer in self._layers():
            layer.cumulative_length.fill_(cur)

    def _compact(self) -> None:
        """Move each row's valid slots to its front, in order (the keys keep their positions)."""
        order = torch.argsort((~self.valid).to(torch.int8), dim=1, stable=True)  # (B, L)
        for layer in self._layers():
            for name in ("keys", "values"):
                x = getattr(layer, name)  # (B, H, L, D)
                at = order[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3])
                setattr(layer, name, x.gather(2, at))
        counts = self.valid.sum(1)
        self.valid = torch.arange(self.L, device=self.device)[None, :] < counts[:, None]
        self._set_cur(int(counts.max()) if counts.numel() else 0)

    def _grow(self, L: int) -> None:
        for layer in self._layers():
            for name in ("keys", "values"):
                x = getattr(layer, name)
                setattr(layer, name, torch.nn.functional.pad(x, (0, 0, 0, L - self.L)))
            layer.max_cache_len = L
        for layer in self.cache.layers:
            layer.max_cache_len = L
        self.valid = torch.nn.functional.pad(self.valid, (0, L - self.L), value=False)
        self.L = L

    def _make_room(self, n: int) -> None:
        """Make sure ``n`` more slots can be written after ``cur``."""
        if self.cur + n <= self.L:
            return
        self._compact()
        if self.cur + n > self.L:
            self._grow(_round_up(self.cur + n))

    # ----------------------------------------------------------------------------------------
    # one turn

    def _prefill(self, pieces: list[list[int]], pad_id: int) -> torch.Tensor:
        """Write each batch row's ``pieces[b]`` (left-padded to the longest) at the next slots;
        returns the logits after each row's last token, (B, V) float32."""
        B, C = len(pieces), max(len(p) for p in pieces)
        ids = torch.full((B, C), pad_id, dtype=torch.long)
        real = torch.zeros(B, C, dtype=torch.bool)
        for b, p in enumerate(pieces):
            if p:
                ids[b, C - len(p) :] = torch.tensor(p, dtype=torch.long)
                real[b, C - len(p) :] = True
        ids, real = ids.to(self.device), real.to(self.device)
        cur, n = self.cur, self.cur + C
        positions = self.length[:, None] + (real.long().cumsum(1) - 1).clamp_min(0)  # (B, C)
        q = torch.arange(C, device=self.device)
        old = self.valid[:, None, :cur].expand(B, C, cur)  # (B, C, cur)
        new = real[:, None, :] & (q[None, None, :] <= q[None, :, None])  # key j <= query i
        new = new | (q[None, None, :] == q[None, :, None])  # a padded query sees itself only
        allowed = torch.cat([old, new], dim=2)  # (B, C, n)
        mask = torch.zeros(B, 1, C, n, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed[:, None], self.neg)
        self.cache.window = n
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.valid[:, cur:n] = real
        self.length += real.sum(1)
        self._set_cur(n)
        return out.logits[:, -1, :].float()

    def _step(self, tokens: torch.Tensor, writes: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens`` (B,) at the next slot, valid where ``writes`` (B,) bool; returns the
        next logits (B, V)."""
        cur = self.cur
        self.valid[:, cur] = writes
        self.cache.window = cur + 1
        mask = torch.zeros(self.valid.shape[0], cur + 1, dtype=self.dtype, device=self.device)
        mask = mask.masked_fill(~self.valid[:, : cur + 1], self.neg)[:, None, None, :]
        positions = self.length[:, None]
        if self.lean is not None:
            logits = _lean_logits(self.lean, self.cache, tokens[:, None], positions, mask)
        else:
            logits = self.model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=positions,
                past_key_values=self.cache,
                use_cache=True,
            ).logits[:, -1, :]
        self.length += writes.long()
        self.cur = cur + 1  # the cache's own counter moved with the write
        return logits.float()

    def sample(
        self,
        rows: Sequence[int],
        new_ids: Sequence[Sequence[int]],
        budgets: Sequence[int],
        row_seeds: torch.Tensor,
        *,
        temperature: float,
        top_k: int,
        top_p: float,
        eos_ids: list[int],
        pad_id: int,
    ) -> tuple[list[list[int]], list[list[float]], list[list[float]]]:
        """Append ``new_ids[i]`` to row ``rows[i]``'s conversation and sample up to
        ``budgets[i]`` (>= 1) tokens after it, stopping after a token of ``eos_ids``; row
        ``rows[i]``'s noise comes from ``row_seeds[i]`` (the draw of step ``t`` of the turn is
        `draw_counter`'s at ``t``, as :func:`marlhf.models.decode.sample`'s). Rows not in ``rows``
        are dropped for good. Returns, per row of ``rows``: the tokens, their log-probs and the
        entropies (`token_stats`)."""
        if any(self.index[r] is None for r in rows) or len(set(rows)) != len(rows):
            raise ValueError(f"rows {list(rows)}: a row was named twice or has ended")
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode() if self.inference_mode else torch.no_grad():
                return self._sample(
                    rows, new_ids, budgets, row_seeds, temperature, top_k, top_p, eos_ids, pad_id
                )
        finally:
            if was_training:
                self.model.train()

    def _sample(
        self, rows, new_ids, budgets, row_seeds, temperature, top_k, top_p, eos_ids, pad_id
    ):
        self._keep_rows(sorted(self.index[r] for r in rows))
        where = {r: i for i, r in enumerate(rows)}  # row -> its place in the call
        for r, ids in zip(rows, new_ids, strict=True):
            self.pending[r].extend(int(t) for t in ids)
        call = [where[r] for r in self.batch_rows]  # batch index -> place in the call
        pieces = [self.pending[r] for r in self.batch_rows]
        if any(not p for p in pieces):
            raise ValueError("a conversation has no tokens to continue from")
        dev = self.device
        budget = torch.tensor([budgets[i] for i in call], dtype=torch.long, device=dev)  # (B,)
        seeds = row_seeds.to(device=dev, dtype=torch.long)[torch.tensor(call, device=dev)]
        steps = int(budget.max())
        self._make_room(max(len(p) for p in pieces) + steps - 1)
        logits = self._prefill(pieces, pad_id)
        for r in self.batch_rows:
            self.pending[r] = []
        eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long, device=dev)
        B = len(pieces)
        out = torch.full((B, steps), pad_id, dtype=torch.long, device=dev)
        logp = torch.zeros(B, steps, device=dev)
        ent = torch.zeros(B, steps, device=dev)
        tok = draw_counter(logits, seeds, 0, temperature, top_k, top_p)
        out[:, 0] = tok
        logp[:, 0], ent[:, 0] = token_stats(logits, tok, temperature)
        done = torch.isin(tok, eos) | (budget <= 1)
        check = 1 if dev.type == "cpu" else 8  # each check syncs with the device
        vocab = torch.arange(logits.shape[-1], device=dev)
        for s in range(1, steps):
            if s % check == 0 and bool(done.all()):
                break
            logits = self._step(torch.where(done, pad_id, tok), ~done)
            nxt = draw_counter(logits, seeds, s, temperature, top_k, top_p, vocab)
            lp, en = token_stats(logits, nxt, temperature)
            tok = torch.where(done, pad_id, nxt)
            out[:, s] = tok
            logp[:, s] = torch.where(done, 0.0, lp)
            ent[:, s] = torch.where(done, 0.0, en)
            done = done | torch.isin(tok, eos) | (budget <= s + 1)
        is_eos = torch.isin(out, eos)
        first = torch.where(is_eos.any(1), is_eos.long().argmax(1) + 1, budget)
        n = torch.minimum(first, budget).tolist()
        out, logp, ent = out.tolist(), logp.tolist(), ent.tolist()
        actions, logps, ents = [None] * B, [None] * B, [None] * B
        for b, r in enumerate(self.batch_rows):
            k = n[b]
            self.pending[r] = [out[b][k - 1]]  # sampled, not fed yet
            i = call[b]
            actions[i], logps[i], ents[i] = out[b][:k], logp[b][:k], ent[b][:k]
        return actions, logps, ents
