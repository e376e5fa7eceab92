"""The HTML view of macro actions (``--render-macro N``): the termination rule's macro actions of the
first N responses, and a histogram of their lengths."""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from marlhf.inference.models import Models
from marlhf.macro import termination_inputs
from marlhf.macro.config import MacroConfig
from marlhf.macro.naming import describe
from marlhf.macro.render import macro_groups, plot_length_histogram, render_html, token_pieces
from marlhf.macro.rules import INPUT_SOURCES
from marlhf.models.sequences import pack_flush_left, response_logprobs_and_entropy

log = logging.getLogger("marlhf.inference")  # one logger name for the whole program

# the per-token rule inputs (marlhf.macro.rules.INPUT_SOURCES) the view computes with the policy:
# the reference model's (``ppl``, ``entropy``) and the rollout's own log-probs (``lowprob``);
# ``turn_end`` (``turn``) comes from the row's turns
POLICY_INPUTS = frozenset(INPUT_SOURCES) - {"turn_end"}


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
    (``ppl``, ``entropy``) get them from the policy itself, as ``lowprob`` gets the log-probs of the
    sampled tokens (at ``temperature``, as the rollout records them); the policy runs only for a
    rule that reads them."""

    @functools.cache
    def policy() -> tuple[torch.Tensor, torch.Tensor]:
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
        return logp.cpu(), ent.cpu()

    inputs = termination_inputs(
        rule,
        response,
        action_mask,
        ends_with_eos,
        ref_logprobs=lambda: policy()[0],
        ref_entropy=lambda: policy()[1],
        old_logprobs=lambda: policy()[0],
        generator=torch.Generator().manual_seed(seed),
    )
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


def page_files(html: str) -> tuple[str, str]:
    """The page and the histogram beside it that :func:`write_macro_page` writes for ``html``
    (``.html`` -> ``_lengths.png``)."""
    stem = html[: -len(".html")] if html.endswith(".html") else html
    return html, stem + "_lengths.png"


def default_page(path: str) -> str:
    """The page of a result file ``<path>.jsonl``: ``<path>.macro.html``."""
    base = path[: -len(".jsonl")] if path.endswith(".jsonl") else path
    return base + ".macro.html"


def write_macro_view(path: str, items: list[dict], macro: MacroConfig, source: str = "") -> str:
    """``<path>.macro.html`` and ``<path>.macro_lengths.png`` of a result file ``<path>.jsonl``
    (:func:`write_macro_page`); returns the page's path."""
    return write_macro_page(default_page(path), items, macro, source)


def write_macro_page(html: str, items: list[dict], macro: MacroConfig, source: str = "") -> str:
    """``html`` showing ``items`` cut by ``macro`` (the rule read from ``source``, named under the
    title), and the histogram of their lengths (:func:`page_files`), which the page shows at its
    end."""
    title = f"Macro actions: {describe(macro)}"
    lengths = [e - s for it in items for s, e in macro_groups(it["macro_end"])]
    figure = plot_length_histogram(lengths, page_files(html)[1]) if lengths else None
    subtitle = f"rule from {source}" if source else ""
    render_html(items, html, title=title, subtitle=subtitle, figure=figure)
    log.info("macro-action view: %s", html)
    return html
