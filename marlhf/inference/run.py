"""The inference program: select prompts, resume the output, load the models, run the batches, write
the summary (the steps are described in the package doc)."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from marlhf.cli import build_parser, given_dests, parse_config
from marlhf.data.long_tasks import gold_scorer_for
from marlhf.data.sources import load_examples
from marlhf.inference.config import InferenceArgs, InferenceConfig
from marlhf.inference.macro_rule import describe, resolve_macro
from marlhf.inference.macro_view import write_macro_view
from marlhf.inference.models import (
    Models,
    device_for,
    eot_ids,
    load_models,
    model_problems,
    open_policy_sampler,
    policy_backend,
    same_vocab,
)
from marlhf.inference.naming import dataset_spec, output_path, sidecar
from marlhf.inference.prompts import select_prompts
from marlhf.inference.results import (
    append_rows,
    prepare_output,
    read_rows,
    run_settings,
    summarize,
)
from marlhf.inference.rows import generate_rows, ref_rows
from marlhf.inference.scoring import TextScorer
from marlhf.macro import build_termination
from marlhf.models.checks import settings_mismatches
from marlhf.models.generation import backend_info
from marlhf.rewards.code import CodeRewarder
from marlhf.stages.exits import raised_on_purpose, report_and_exit

log = logging.getLogger("marlhf.inference")  # one logger name for the whole program


def _want_gold(cfg: InferenceConfig, examples: Sequence[Any]):
    """The gold scorer of ``--gold_score`` (``(prompt, response) -> float``) or None: ``auto`` scores
    when the prompts come from a synthetic task (``synthetic-tldr``, ``synthetic-facts-*``,
    ``synthetic-verdict-*``: `marlhf.data.long_tasks.gold_scorer_for`); ``on`` requires one."""
    if cfg.gold_score == "off":
        return None
    prefixes = {e.prompt_id.split("/")[0] for e in examples}
    scorer = gold_scorer_for(dataset_spec(cfg.dataset))
    if scorer is None and len(prefixes) == 1:
        scorer = gold_scorer_for(prefixes.pop())
    if scorer is None and cfg.gold_score == "on":
        raise ValueError(
            f"--gold_score on: --dataset {cfg.dataset} is no synthetic task, which alone has a "
            "gold score (synthetic, synthetic-tldr, synthetic-facts-16|64|256, "
            "synthetic-verdict-16|64|256)"
        )
    return scorer


def _progress(total: int, disable: bool):
    return tqdm(total=total, desc="inference", unit="prompt", disable=disable, file=sys.stderr)


def _select(cfg: InferenceConfig) -> tuple[list[Any], bool, int]:
    """The selected prompts, whether they are code problems (APPS) and the bad rows skipped."""
    spec = dataset_spec(cfg.dataset)
    examples, n_bad = load_examples(
        spec, cfg.split, skip_bad_rows=cfg.skip_bad_rows, columns=cfg.data.column_mapping()
    )
    if not examples:
        raise ValueError(f"--dataset {cfg.dataset}: no {cfg.split} examples")
    selected = select_prompts(examples, cfg.num_samples, cfg.selection_seed)
    is_code = all("tests" in e.meta for e in selected)
    if cfg.ref_scores:
        selected = [e for e in selected if e.chosen is not None and e.rejected is not None]
        if not selected:
            raise ValueError(f"--ref-scores: {cfg.dataset} has no chosen/rejected pairs")
    return selected, is_code, n_bad


@dataclass
class _Tools:
    """What scores a batch besides the policy: the macro-action rule of the HTML view, the code
    rewarder (APPS), the text scorer and whether policy and RM share token ids."""

    rule: Any = None
    macro: Any = None  # the rule's MacroConfig and where it came from (resolve_macro)
    macro_source: str = ""
    rewarder: Any = None
    scorer: TextScorer | None = None
    shared_ids: bool = False


def _tools(
    args: InferenceArgs, models: Models, is_code: bool, macro_given: frozenset[str] | None
) -> _Tools:
    cfg = args.inference
    tools = _Tools()
    if cfg.render_macro and not cfg.ref_scores:
        tools.macro, tools.macro_source = resolve_macro(cfg.model, args.macro, macro_given)
        log.info("macro actions: %s, from %s", describe(tools.macro), tools.macro_source)
        tools.rule = build_termination(tools.macro, models.tokenizer)
    if is_code and not cfg.ref_scores:
        tools.rewarder = CodeRewarder.from_config(args.code)
    if models.reward_model is not None:
        budget = cfg.sampling.max_prompt_seq_len + cfg.sampling.max_answer_seq_len
        tools.scorer = TextScorer(
            models.reward_model, models.rm_tokenizer, eot_ids(models.rm_tokenizer, cfg), budget
        )
        tools.shared_ids = models.tokenizer is not None and same_vocab(
            models.tokenizer, models.rm_tokenizer
        )
        if models.tokenizer is not None and not tools.shared_ids:
            log.warning(
                "the reward model's vocabulary differs from the policy's: re-tokenising text"
            )
    return tools


def _run_batches(
    todo: list[Any], cfg: InferenceConfig, models: Models, tools: _Tools, gold, path: str
) -> tuple[list[dict], int]:
    """Run and append the batches (``--max_batches`` of them at most); returns the macro-view items
    and the number of prompts cut from the left. Closes the code rewarder."""
    n_cut = 0
    html_items: list[dict] = []
    bar = _progress(len(todo), cfg.disable_progress_bar)
    try:
        for i, start in enumerate(range(0, len(todo), cfg.batch_size)):
            if cfg.max_batches and i >= cfg.max_batches:
                break
            batch = todo[start : start + cfg.batch_size]
            if cfg.ref_scores:
                rows = ref_rows(batch, tools.scorer, gold)
            else:
                rows, items, cut = generate_rows(
                    batch,
                    cfg,
                    models,
                    tools.scorer,
                    tools.shared_ids,
                    tools.rewarder,
                    gold,
                    tools.rule,
                    want_items=len(html_items) < cfg.render_macro,
                )
                n_cut += cut
                html_items += items
            append_rows(path, rows)
            bar.update(len(batch))
    finally:
        bar.close()
        if tools.rewarder is not None:
            tools.rewarder.close()
    return html_items, n_cut


def run_inference(args: InferenceArgs, macro_given: frozenset[str] | None = None) -> dict:
    """Run the program; returns the summary (also written to ``<output>.summary.json``).

    ``macro_given``: the macro-action fields set on the command line, which replace those of the
    rule the policy was trained with in the ``--render-macro`` view (None: the fields of
    ``args.macro`` that differ from the defaults; `marlhf.inference.macro_rule`)."""
    cfg = args.inference
    problems = model_problems(cfg)
    if problems:
        raise ValueError("; ".join(problems))
    path = output_path(cfg)
    selected, is_code, n_bad = _select(cfg)
    gold = _want_gold(cfg, selected)
    backend = "hf" if cfg.ref_scores else policy_backend(cfg)
    if not (cfg.reward_model or is_code or gold is not None):
        log.info("no reward model: sampling only (the rows have no reward)")

    settings = run_settings(cfg, args.macro, args.code, backend)
    done = prepare_output(path, settings, cfg.overwrite)
    todo = [e for e in selected if e.prompt_id not in done]
    log.info(
        "%s: %d prompts selected, %d already done, %d to run",
        path,
        len(selected),
        len(done),
        len(todo),
    )

    trained = {"--model_name_or_path": cfg.model, "--reward_model_name_or_path": cfg.reward_model}
    for problem in settings_mismatches(trained, vars(cfg)):  # what the models were trained on
        log.warning("%s: the model sees other texts than it learned on", problem)
    # the policy module: for a backend that samples with it, or for the macro-action view
    module = backend_info(backend).uses_model or cfg.render_macro > 0
    models = load_models(cfg, device_for(cfg.gpu), not cfg.ref_scores, policy_module=module)
    try:
        if not cfg.ref_scores:
            models.sampler = open_policy_sampler(cfg, models, backend)
        tools = _tools(args, models, is_code, macro_given)
        html_items, n_cut = _run_batches(todo, cfg, models, tools, gold, path)
    finally:
        if models.sampler is not None:
            models.sampler.close()
    if n_cut:
        log.warning(
            "%d prompts longer than --max_prompt_seq_len %d were cut from the left",
            n_cut,
            cfg.sampling.max_prompt_seq_len,
        )
    if html_items:
        write_macro_view(path, html_items[: cfg.render_macro], tools.macro, tools.macro_source)

    rows = read_rows(path)
    summary = summarize(rows, cfg.pass_k if is_code else ())
    summary.update(
        {
            "output": path,
            "selected": len(selected),
            "complete": len(rows) >= len(selected),
            "bad_rows_skipped": n_bad,
        }
    )
    with open(sidecar(path, "summary"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
        f.write("\n")
    return summary


def main(argv: Sequence[str] | None = None) -> dict:
    """Parse flags (see ``--help``), run, print the summary. An error raised on purpose (a missing
    model, a reward model that is none, lengths beyond the context, a bad data row, ...) ends the
    program with one ``error:`` line and status 2 for bad input (:mod:`marlhf.stages.exits`);
    ``MARLHF_TRACEBACK=1`` shows its traceback."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # the package's first line describes the program (the package is imported before this module)
    description = sys.modules[__package__].__doc__.strip().splitlines()[0]
    args = parse_config(InferenceArgs, argv, description=description)
    parser = build_parser(InferenceArgs, description)
    given = {d.split(".", 1)[1] for d in given_dests(parser, argv) if d.startswith("macro.")}
    try:
        summary = run_inference(args, frozenset(given))
    except Exception as err:
        if os.environ.get("MARLHF_TRACEBACK") or not raised_on_purpose(err):
            raise
        report_and_exit(err)
    print(json.dumps(summary, indent=2, sort_keys=True))
    return summary
