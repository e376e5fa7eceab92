"""The HTML view of macro actions (``--render-macro N``): the termination rule's macro actions of the
first N responses, and a histogram of their lengths."""

from __future__ import annotations

import logging
from typing import Any

import torch

from marlhf.inference.models import Models
from marlhf.macro.config import MacroConfig

log = logging.getLogger("marlhf.inference")  # one logger name for the whole program


@torch.no_grad()
def macro_items(
    rule: Any,
    models: Models,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response: torch.Tensor,
    action_mask: torch.Tensor,
    ends_with_eos: torch.Tensor,
    prompts: list[str],
    rewards: list[float | None],
    temperature: float,
    seed: int,
) -> list[dict]:
    """Macro actions of one batch for the HTML view. Rules that need reference-model quantities
    (``ppl``, ``entropy``) get them from the policy itself, as ``lowprob`` gets the sampled tokens'
    log-probs."""
    from marlhf.macro import TerminationInputs
    from marlhf.macro.render import token_pieces
    from marlhf.rl.rollout import pack_flush_left, response_logprobs_and_entropy

    inputs = TerminationInputs(
        response_ids=response,
        action_mask=action_mask,
        ends_with_eos=ends_with_eos,
        generator=torch.Generator().manual_seed(seed),
    )
    if rule.needs & {"ref_logprobs", "ref_entropy", "old_logprobs"}:
        seq, mask, start = pack_flush_left(
            prompt_ids, prompt_mask, response, action_mask, models.tokenizer.pad_token_id
        )
        logits = (
            models.policy(
                input_ids=seq.to(models.device), attention_mask=mask.long().to(models.device)
            ).logits.float()
            / temperature
        )
        logp, ent = response_logprobs_and_entropy(
            logits,
            seq.to(models.device),
            start.to(models.device),
            response.shape[1],
            with_entropy=True,
        )
        inputs.ref_logprobs, inputs.ref_entropy = logp.cpu(), ent.cpu()
        inputs.old_logprobs = inputs.ref_logprobs
    macro_end = rule(inputs).macro_end
    items = []
    for b in range(response.shape[0]):
        n = int(action_mask[b].sum())
        items.append(
            {
                "prompt": prompts[b],
                "pieces": token_pieces(models.tokenizer, response[b, :n].tolist()),
                "macro_end": macro_end[b, :n].tolist(),
                "reward": rewards[b],
            }
        )
    return items


def write_macro_view(path: str, items: list[dict], macro: MacroConfig) -> None:
    from marlhf.macro.render import macro_groups, plot_length_histogram, render_html

    base = path[: -len(".jsonl")] if path.endswith(".jsonl") else path
    title = f"Macro actions ({macro.termination_condition}, ngram={macro.ngram})"
    render_html(items, base + ".macro.html", title=title)
    lengths = [e - s for it in items for s, e in macro_groups(it["macro_end"])]
    if lengths:
        plot_length_histogram(lengths, base + ".macro_lengths.png")
    log.info("macro-action view: %s.macro.html", base)
