"""Flags of the LLM judge (``evaluation/gpt4-eval.py``, ``evaluation/gpt4-webgpt-eval.py``): the
result files, the judge model and its server, concurrency and retries, prices, the bootstrap; the
template of each dataset and the checks of the input and output paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from marlhf.config import check_own_numbers, flag
from marlhf.data.names import canonical, names_help
from marlhf.judge.pairing import output_overwrites, result_file_field

# Dataset name (marlhf.data.names, the names every tool shares) -> judge template.
JUDGE_TEMPLATES = {
    "summarize": "summarize",
    "hh-rlhf": "hh-rlhf",
    "webgpt": "webgpt",
    "synthetic": "summarize",  # the bundled synthetic task is a TL;DR summarisation task
}


DATASETS = tuple(JUDGE_TEMPLATES)


# USD per 1M (input, output) tokens, list prices of OpenAI's API as published in 2024-2025; override
# with --price_input/--price_output for other models or when prices change.
PRICES_PER_1M: dict[str, tuple[float, float]] = {
    "gpt-4o-2024-05-13": (5.00, 15.00),
    "gpt-4o-2024-08-06": (2.50, 10.00),
    "gpt-4o-2024-11-20": (2.50, 10.00),
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o-mini-2024-07-18": (0.15, 0.60),
    "gpt-4-turbo": (10.00, 30.00),
    "gpt-4-turbo-2024-04-09": (10.00, 30.00),
    "gpt-4": (30.00, 60.00),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
}


@dataclass
class JudgeConfig:
    """Pairwise LLM-judge evaluation of two result files."""

    model_name_a: str = result_file_field("a")
    model_name_b: str = result_file_field("b")
    output: str = flag(help="Per-pair results JSONL (summary: <output>.summary.json).")
    dataset: str | None = flag(
        None,
        f"Dataset, which picks the judge template: {names_help(DATASETS)} "
        "(synthetic: the summarize template; apps has none, programs are scored by tests). "
        "Default summarize; gpt4-webgpt-eval.py always uses webgpt.",
    )
    sk: str | None = field(
        default=None,
        repr=False,
        metadata={
            "help": "API key (compatibility flag; it shows in the process list: set "
            "OPENAI_API_KEY instead, a warning says so). Never logged."
        },
    )
    base_url: str | None = flag(
        None,
        "OpenAI-compatible endpoint (default: OPENAI_BASE_URL, else api.openai.com).",
        aliases=("--base-url",),
    )
    judge_model: str = flag(
        "gpt-4o-2024-05-13", "Judge model (a fixed snapshot).", aliases=("--judge-model",)
    )
    concurrency: int = flag(8, "Requests in flight at most.", range="[1, inf)")
    max_retries: int = flag(
        5,
        "Retries on 429/5xx/timeouts before an item is invalid.",
        aliases=("--max-retries",),
        range="[0, inf)",
    )
    retry_base_delay: float = flag(
        1.0,
        "First backoff in seconds (doubles each retry, with jitter).",
        aliases=("--retry-base-delay",),
        range="[0, inf)",
    )
    timeout: float = flag(60.0, "Per-request timeout in seconds.", range="(0, inf)")
    cache_dir: str | None = flag(
        None,
        "Reply cache directory (default: .judge_cache next to --output).",
        aliases=("--cache-dir",),
    )
    seed: int = flag(42, "Seed of the bootstrap, jitter and API seed.")
    limit: int | None = flag(None, "Judge only the first N pairs.", range="[1, inf)")
    dry_run: bool = flag(False, "Print the cost estimate and exit.", aliases=("--dry-run",))
    price_input: float | None = flag(
        None,
        "USD per 1M input tokens (overrides the table).",
        aliases=("--price-input",),
        range="[0, inf)",
    )
    price_output: float | None = flag(
        None,
        "USD per 1M output tokens (overrides the table).",
        aliases=("--price-output",),
        range="[0, inf)",
    )
    bootstrap: int = flag(2000, "Bootstrap resamples for the 95 percent CI.", range="[1, inf)")
    length_tolerance: float = flag(
        0.10, "Relative length difference of a length-matched pair.", range="[0, 1)"
    )
    retry_unparseable: bool = flag(
        False,
        "Ask the judge again for cached replies without a valid verdict (they are "
        "replaced in the cache); otherwise those pairs stay invalid on a re-run.",
        aliases=("--retry-unparseable",),
    )

    def __post_init__(self) -> None:
        check_own_numbers(self)
        if self.dataset is not None:
            template_for(self.dataset)  # raises for a name without a judge template


# what `marlhf judge --help` opens with
JUDGE_HELP = (
    "Compare two models by their answers to the same prompts, judged by an LLM: each pair of "
    "answers (the result files of marlhf infer) is judged in both orders and the verdicts "
    "combined; the per-pair verdicts go to --output and model a's win rate over model b, with a "
    "bootstrap interval and a length-controlled check, to <output>.summary.json and the console. "
    "Main flags: --model_name_a and --model_name_b (the result files), --dataset (which judge "
    "prompt), --judge_model and --base_url (any OpenAI-compatible server; the key comes from "
    "OPENAI_API_KEY), --dry_run (print the cost estimate and stop)."
)


@dataclass
class JudgeStage:
    """The LLM judge's flags (:data:`JUDGE_HELP`)."""

    judge: JudgeConfig


class JudgeInputError(ValueError):
    """Flags or files the judge cannot run with (``main`` exits 2)."""


def template_for(dataset: str) -> str:
    """The judge template of a dataset name or alias (``hh`` -> ``hh-rlhf``); ValueError otherwise."""
    name = canonical(dataset)
    if name == "apps":
        raise ValueError(
            "--dataset apps: the judge has no template for code; APPS programs are scored by their "
            "tests (inference/inference_with_rewards.py --dataset apps)"
        )
    if name not in JUDGE_TEMPLATES:
        raise ValueError(f"--dataset must be one of: {names_help(DATASETS)}; got {dataset!r}")
    return JUDGE_TEMPLATES[name]


def check_output_path(cfg: JudgeConfig) -> None:
    """Refuse an ``--output`` (or its summary file) that is one of the input files."""
    problem = output_overwrites(
        cfg.output, {"--model_name_a": cfg.model_name_a, "--model_name_b": cfg.model_name_b}
    )
    if problem:
        raise JudgeInputError(problem)


def prices(cfg: JudgeConfig) -> tuple[float | None, float | None]:
    """(input, output) USD per 1M tokens: the flags if given, else the table, else None."""
    table = PRICES_PER_1M.get(cfg.judge_model, (None, None))
    pin = cfg.price_input if cfg.price_input is not None else table[0]
    pout = cfg.price_output if cfg.price_output is not None else table[1]
    return pin, pout
