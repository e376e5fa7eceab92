"""Inference: sample responses for validation prompts and score them with the reward model.

The program behind ``inference/inference_with_rewards.py`` (MA-RLHF README, "Inference")::

    python inference/inference_with_rewards.py --proj-path $PROJ --dataset summarize \\
        --model $ACTOR --reward-model $RM --temperature 0.8 --gpu 0 --batch-size 16

1. **Prompts.** The ``--split`` (default eval) examples of ``--dataset`` are de-duplicated by
   ``prompt_id`` (comparison datasets list a post once per pair) and the ``--num-samples`` prompts
   with the smallest ``sha256(f"{seed}:{prompt_id}")`` are kept, in that order. The choice depends
   only on the set of prompts and the seed — not on the batch size, the file order or an earlier
   run — and a smaller ``--num-samples`` gives a prefix of a larger one.
2. **Generation.** ``bos + prompt`` (cut from the left to ``--max-prompt-len``, as PPO does with
   ``truncate_left``) is left-padded and sampled with ``--temperature/--top-k/--top-p`` for at most
   ``--max-new-tokens``. The response is valid up to and including its first EOS
   (:func:`marlhf.rl.rollout.response_mask`).
3. **Score.** Prompt and response are packed flush-left (:func:`marlhf.rl.rollout.pack_flush_left`)
   and the RM's value at the last valid token is the reward, exactly as PPO scores a rollout
   (EOS included; a response cut at the length limit is scored at its last token). An RM with a
   different vocabulary re-tokenises the text instead (``bos + prompt + response + eos``).
4. **Output.** ``${proj_path}/results/${dataset}/temperature=${T}/${model_name}.jsonl``, one JSON
   object per prompt: ``prompt_id, prompt, response, reward, response_tokens, ends_with_eos`` (+
   ``gold`` on the synthetic task; + ``chosen_*``/``rejected_*`` with ``--ref-scores``; APPS rows add
   ``responses``, ``rewards``, ``n_correct``). ``model_name`` joins the last three path components
   of ``--model`` (``run1-checkpoints-step-100``), so checkpoints of one run do not overwrite each
   other. The settings go to ``<output>.meta.json`` and a summary to ``<output>.summary.json``.

Resuming: rows are appended, flushed and fsynced after every batch; a re-run skips prompt ids
already in the file (a half-written last line from a killed run is cut off first). A re-run whose
settings differ from the sidecar's is refused unless ``--overwrite``.

``--ref-scores`` scores the dataset's own chosen/rejected responses instead of generating
(``response``/``reward`` are then the chosen ones). APPS (``--dataset apps``) samples
``--n-samples-per-prompt`` programs per problem, runs them on the problem's tests in the sandbox
(:mod:`marlhf.code_reward`), uses the pass fraction as reward and reports unbiased pass@k.

>>> model_name("/runs/run1/checkpoints/step-100")
'run1-checkpoints-step-100'
>>> model_name("google/gemma-2b"), model_name("tiny")
('google-gemma-2b', 'tiny')
>>> dataset_spec("summarize"), dataset_spec("data/my.jsonl")
('openai/summarize_from_feedback', 'data/my.jsonl')
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from marlhf.code_reward import CodeRewardConfig
from marlhf.macro.config import MacroConfig

log = logging.getLogger(__name__)

# The original script's --dataset names; anything else is passed to the data adapters as a spec.
DATASETS = {
    "summarize": "openai/summarize_from_feedback",
    "hh-rlhf": "Dahoas/full-hh-rlhf",
    "webgpt": "openai/webgpt_comparisons",
    "apps": "codeparrot/apps",
    "synthetic": "synthetic-tldr",
}
DTYPE_CHOICES = ("auto", "fp32", "fp16", "bf16")
GOLD_CHOICES = ("auto", "on", "off")
# Settings that do not change what a row means: a re-run may change them freely.
_FREE_SETTINGS = frozenset(
    {
        "num_samples",
        "batch_size",
        "gpu",
        "output",
        "overwrite",
        "render_macro",
        "max_batches",
        "disable_progress_bar",
        "pass_k",
        "proj_path",
        "skip_bad_rows",
        "save_token_ids",
    }
)


@dataclass
class InferenceConfig:
    """Inference: generate for validation prompts and score with the reward model."""

    proj_path: str = field(
        default=".",
        metadata={
            "help": "Project directory; results go to <proj_path>/results/...",
            "aliases": ("--proj-path",),
        },
    )
    dataset: str = field(
        default="synthetic",
        metadata={
            "help": "summarize | hh-rlhf | webgpt | apps | synthetic, or a data spec "
            "(registered name or local file/directory)."
        },
    )
    model: str = field(
        default="tiny",
        metadata={"help": "Policy: an SFT/PPO checkpoint directory, a hub id, or `tiny`."},
    )
    reward_model: str | None = field(
        default=None,
        metadata={
            "help": "Reward-model directory (stage 2). Optional for APPS.",
            "aliases": ("--reward-model",),
        },
    )
    temperature: float = field(default=0.8, metadata={"help": "Sampling temperature."})
    top_k: int = field(
        default=50, metadata={"help": "Top-k sampling (0: off).", "aliases": ("--top-k",)}
    )
    top_p: float = field(
        default=1.0, metadata={"help": "Nucleus sampling.", "aliases": ("--top-p",)}
    )
    max_new_tokens: int = field(
        default=512, metadata={"help": "Maximum response tokens.", "aliases": ("--max-new-tokens",)}
    )
    max_prompt_len: int = field(
        default=512,
        metadata={
            "help": "Prompt tokens (bos included); longer prompts lose tokens from the left.",
            "aliases": ("--max-prompt-len",),
        },
    )
    end_of_conversation_token: str | None = field(
        default=None,
        metadata={
            "help": "Extra stop token, also appended to --ref-scores responses "
            "(default: the tokenizer's eos)."
        },
    )
    gpu: int = field(
        default=0, metadata={"help": "CUDA device index (CPU when no GPU is available)."}
    )
    dtype: str = field(
        default="auto",
        metadata={
            "help": "Weights' precision (auto: bf16 on a GPU that has it, else fp32).",
            "choices": DTYPE_CHOICES,
        },
    )
    batch_size: int = field(
        default=16, metadata={"help": "Prompts per generation call.", "aliases": ("--batch-size",)}
    )
    num_samples: int = field(
        default=2000,
        metadata={"help": "Validation prompts to use (0: all).", "aliases": ("--num-samples",)},
    )
    seed: int = field(default=1234, metadata={"help": "Prompt selection and sampling seed."})
    split: str = field(
        default="eval", metadata={"help": "Dataset split.", "choices": ("eval", "train")}
    )
    skip_bad_rows: bool = field(default=False, metadata={"help": "Skip malformed dataset rows."})
    ref_scores: bool = field(
        default=False,
        metadata={
            "help": "Score the dataset's chosen/rejected responses instead of generating.",
            "aliases": ("--ref-scores",),
        },
    )
    output: str | None = field(
        default=None,
        metadata={
            "help": "Output .jsonl (default <proj_path>/results/<dataset>/"
            "temperature=<T>/<model_name>.jsonl)."
        },
    )
    overwrite: bool = field(
        default=False, metadata={"help": "Start the output afresh instead of resuming it."}
    )
    gold_score: str = field(
        default="auto",
        metadata={
            "help": "Add the synthetic task's gold score (auto: when --dataset is synthetic).",
            "choices": GOLD_CHOICES,
        },
    )
    save_token_ids: bool = field(
        default=False, metadata={"help": "Also write response_ids (exact token ids) per row."}
    )
    render_macro: int = field(
        default=0,
        metadata={
            "help": "Write an HTML view of the macro actions (--termination_condition ...) "
            "of the first N responses of this run.",
            "aliases": ("--render-macro",),
        },
    )
    n_samples_per_prompt: int = field(
        default=1,
        metadata={
            "help": "APPS: programs sampled per problem.",
            "aliases": ("--n-samples-per-prompt",),
        },
    )
    pass_k: tuple[int, ...] = field(
        default=(1, 5), metadata={"help": "APPS: k values of pass@k.", "aliases": ("--pass-k",)}
    )
    max_batches: int = field(
        default=0, metadata={"help": "Stop after N batches (0: all); re-run to continue."}
    )
    disable_progress_bar: bool = field(default=False, metadata={"help": "No tqdm bar."})

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"--temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"--top-k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")
        for name in ("max_new_tokens", "max_prompt_len", "batch_size", "n_samples_per_prompt"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}"
                )
        for name in ("num_samples", "render_macro", "max_batches", "gpu"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}"
                )
        if not self.pass_k or any(k < 1 for k in self.pass_k):
            raise ValueError(f"--pass-k must be a list of integers >= 1, got {self.pass_k}")
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"--dtype must be one of {DTYPE_CHOICES}, got {self.dtype!r}")
        if self.gold_score not in GOLD_CHOICES:
            raise ValueError(f"--gold_score must be one of {GOLD_CHOICES}, got {self.gold_score!r}")
        if self.split not in ("eval", "train"):
            raise ValueError(f"--split must be eval or train, got {self.split!r}")
        if self.ref_scores and not self.reward_model:
            raise ValueError("--ref-scores needs --reward-model")


@dataclass
class InferenceArgs:
    """All flags of the inference program (the CLI is generated from these parts)."""

    inference: InferenceConfig = field(default_factory=InferenceConfig)
    macro: MacroConfig = field(default_factory=MacroConfig)
    code: CodeRewardConfig = field(default_factory=CodeRewardConfig)


# --- names and paths -----------------------------------------------------------------------------
def dataset_spec(name: str) -> str:
    """The original script's short dataset name -> a data-adapter spec (others unchanged)."""
    return DATASETS.get(name, name)


def model_name(path: str, depth: int = 3) -> str:
    """A file-name-safe name for a model: its last ``depth`` path components joined with ``-``."""
    parts = [p for p in re.split(r"[\\/]+", os.path.normpath(path)) if p not in ("", ".", "..")]
    name = "-".join(parts[-depth:]) or "model"
    return re.sub(r"[^A-Za-z0-9._=+-]+", "_", name)


def output_path(cfg: InferenceConfig) -> str:
    """``--output`` or ``<proj_path>/results/<dataset>/temperature=<T>/<model_name>.jsonl``."""
    if cfg.output:
        return cfg.output
    if cfg.ref_scores:
        name = "ref-scores-" + model_name(cfg.reward_model or "rm")
    else:
        name = model_name(cfg.model)
    return os.path.join(
        cfg.proj_path,
        "results",
        model_name(cfg.dataset, depth=1),
        f"temperature={cfg.temperature}",
        f"{name}.jsonl",
    )


def sidecar(path: str, kind: str) -> str:
    """``<output>.<kind>.json`` next to the output (kind: meta, summary)."""
    return f"{path}.{kind}.json"


# --- prompt selection ----------------------------------------------------------------------------
def selection_key(prompt_id: str, seed: int) -> str:
    return hashlib.sha256(f"{seed}:{prompt_id}".encode()).hexdigest()


def select_prompts(examples: Sequence[Any], num_samples: int, seed: int) -> list[Any]:
    """De-duplicate by ``prompt_id`` (first occurrence kept) and keep the ``num_samples`` (0: all)
    with the smallest ``sha256(f"{seed}:{prompt_id}")``, in that order.

    >>> from types import SimpleNamespace as E
    >>> exs = [E(prompt_id=f"p{i}") for i in range(10)] + [E(prompt_id="p3")]
    >>> a = [e.prompt_id for e in select_prompts(exs, 4, seed=1)]
    >>> b = [e.prompt_id for e in select_prompts(list(reversed(exs)), 4, seed=1)]
    >>> a == b, len(set(a)), [e.prompt_id for e in select_prompts(exs, 2, seed=1)] == a[:2]
    (True, 4, True)
    """
    first: dict[str, Any] = {}
    for e in examples:
        first.setdefault(e.prompt_id, e)
    ranked = sorted(first.values(), key=lambda e: selection_key(e.prompt_id, seed))
    return ranked[:num_samples] if num_samples else ranked


# --- output file: resume, settings, append --------------------------------------------------------
def repair_tail(path: str) -> int:
    """Cut a half-written last line (a run killed mid-write); returns the bytes removed."""
    if not os.path.exists(path):
        return 0
    with open(path, "rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        f.seek(0)
        data = f.read()
        keep = data.rfind(b"\n") + 1
        f.truncate(keep)
    log.warning("%s: removed a half-written last line (%d bytes)", path, size - keep)
    return size - keep


def read_rows(path: str) -> list[dict]:
    """The complete rows of a result file (ValueError naming the line for a corrupt one)."""
    rows: list[dict] = []
    if not os.path.exists(path):
        return rows
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if not line.endswith("\n"):
                break  # half-written last line: not a result
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict) or "prompt_id" not in row:
                raise ValueError(f'{path} line {lineno}: field "prompt_id" missing')
            rows.append(row)
    return rows


def run_settings(cfg: InferenceConfig, macro: MacroConfig, code: CodeRewardConfig) -> dict:
    """What the rows of an output depend on (compared with the sidecar when resuming)."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _FREE_SETTINGS}
    settings["dataset_spec"] = dataset_spec(cfg.dataset)
    settings["model_path"] = os.path.abspath(cfg.model) if os.path.exists(cfg.model) else cfg.model
    if cfg.reward_model:
        settings["reward_model_path"] = os.path.abspath(cfg.reward_model)
    if cfg.n_samples_per_prompt > 1 or dataset_spec(cfg.dataset) == "codeparrot/apps":
        settings["code"] = dataclasses.asdict(code)
    return json.loads(json.dumps(settings))


def prepare_output(path: str, settings: dict, overwrite: bool) -> set[str]:
    """Check/write ``<path>.meta.json`` and return the prompt ids already written.

    Raises ValueError when the sidecar's settings differ from ``settings`` (unless ``overwrite``,
    which deletes the output and its sidecars first).
    """
    meta_path = sidecar(path, "meta")
    if overwrite:
        for p in (path, meta_path, sidecar(path, "summary")):
            if os.path.exists(p):
                os.remove(p)
    if os.path.exists(meta_path):
        with open(meta_path, encoding="utf-8") as f:
            old = json.load(f).get("settings", {})
        diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        if diff:
            detail = ", ".join(f"{k}: {old.get(k)!r} -> {settings.get(k)!r}" for k in diff[:6])
            raise ValueError(
                f"{path} was written with other settings ({detail}); refusing to mix results. "
                "Pass --overwrite to start afresh or --output for another file."
            )
    elif os.path.exists(path) and os.path.getsize(path) > 0:
        raise ValueError(
            f"{path} exists without its {os.path.basename(meta_path)}; refusing to append to it "
            "(pass --overwrite)"
        )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(meta_path, "w", encoding="utf-8") as f:
        json.dump({"settings": settings}, f, indent=2, sort_keys=True)
        f.write("\n")
    repair_tail(path)
    return {r["prompt_id"] for r in read_rows(path)}


def append_rows(path: str, rows: list[dict]) -> None:
    """Append rows and make them durable (flush + fsync): a kill loses at most the current batch."""
    with open(path, "a", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


# --- summary -------------------------------------------------------------------------------------
def _mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0
    return mean, math.sqrt(var)


def summarize(rows: list[dict], pass_k: Sequence[int] = ()) -> dict:
    """Summary of a result file: n, reward mean/std (sample std), mean response length, EOS rate,
    mean gold when rows carry it; with ``--ref-scores`` rows the chosen/rejected means and the RM's
    accuracy (chosen > rejected); with APPS rows unbiased pass@k averaged over problems."""
    out: dict[str, Any] = {"n": len(rows)}
    rewards = [float(r["reward"]) for r in rows if r.get("reward") is not None]
    out["reward_mean"], out["reward_std"] = _mean_std(rewards)
    lengths = [r["response_tokens"] for r in rows if "response_tokens" in r]
    out["response_tokens_mean"] = sum(lengths) / len(lengths) if lengths else None
    eos = [float(r["ends_with_eos"]) for r in rows if "ends_with_eos" in r]
    out["eos_rate"] = sum(eos) / len(eos) if eos else None
    golds = [float(r["gold"]) for r in rows if r.get("gold") is not None]
    if golds:
        out["gold_mean"], out["gold_std"] = _mean_std(golds)
    pairs = [
        r
        for r in rows
        if r.get("rejected_reward") is not None and r.get("chosen_reward") is not None
    ]
    if pairs:
        out["chosen_reward_mean"] = sum(r["chosen_reward"] for r in pairs) / len(pairs)
        out["rejected_reward_mean"] = sum(r["rejected_reward"] for r in pairs) / len(pairs)
        out["accuracy"] = sum(r["chosen_reward"] > r["rejected_reward"] for r in pairs) / len(pairs)
    code = [r for r in rows if "n_correct" in r]
    if code:
        from marlhf.code_reward import pass_at_k

        for k in pass_k:
            usable = [r for r in code if len(r["rewards"]) >= k]
            if usable:
                out[f"pass@{k}"] = sum(
                    pass_at_k(len(r["rewards"]), r["n_correct"], k) for r in usable
                ) / len(usable)
    return out


# --- tensors -------------------------------------------------------------------------------------
def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids (B, P) long, mask (B, P) bool), padded on the left.

    >>> ids, mask = left_pad([[5, 6], [7]], pad_id=0)
    >>> ids.tolist(), mask.int().tolist()
    ([[5, 6], [0, 7]], [[1, 1], [0, 1]])
    """
    P = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), P), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), P, dtype=torch.bool)
    for b, s in enumerate(seqs):
        if s:
            ids[b, P - len(s) :] = torch.tensor(list(s), dtype=torch.long)
            mask[b, P - len(s) :] = True
    return ids, mask


def right_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids (B, T) long, mask (B, T) bool), padded on the right."""
    T = max(max(len(s) for s in seqs), 1)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    for b, s in enumerate(seqs):
        if s:
            ids[b, : len(s)] = torch.tensor(list(s), dtype=torch.long)
            mask[b, : len(s)] = True
    return ids, mask


@torch.no_grad()
def end_rewards(
    reward_model: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """RM value at the last valid token: sequences, attention_mask (B, T) -> (B,) float32."""
    from marlhf.rl.rollout import end_index

    values = reward_model(sequences, attention_mask.long())  # (B, T)
    idx = end_index(attention_mask).to(values.device)
    return values.gather(1, idx.unsqueeze(1)).squeeze(1).float()


@torch.no_grad()
def score_rollout(
    reward_model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    action_mask: torch.Tensor,
    pad_id: int,
) -> torch.Tensor:
    """Score as PPO does: pack flush-left, RM value at the last valid token.

    prompt_ids, prompt_mask: (B, P) left-padded; response_ids, action_mask: (B, A) right-padded.
    Returns (B,) float32.
    """
    from marlhf.rl.rollout import pack_flush_left

    seq, mask, _ = pack_flush_left(prompt_ids, prompt_mask, response_ids, action_mask, pad_id)
    device = next(reward_model.parameters()).device
    return end_rewards(reward_model, seq.to(device), mask.to(device)).cpu()


class TextScorer:
    """Scores (prompt, response) texts with an RM: ``bos + prompt + response [+ eos]`` (prompt and
    response tokenised separately, as the RM stage builds its pairs), cut to ``budget`` tokens with
    :func:`marlhf.data.tokenize.fit`, batched right-padded."""

    def __init__(
        self, reward_model: torch.nn.Module, tokenizer: Any, eot: list[int], budget: int
    ) -> None:
        from marlhf.data.tokenize import bos_prefix

        self.rm, self.tok, self.eot = reward_model, tokenizer, eot
        self.bos = bos_prefix(tokenizer)
        self.budget = budget - len(self.bos)

    def encode(
        self, prompts: Sequence[str], responses: Sequence[str], add_eot: Sequence[bool]
    ) -> list[list[int]]:
        from marlhf.data.tokenize import fit

        p_ids = self.tok(list(prompts), add_special_tokens=False)["input_ids"]
        r_ids = self.tok(list(responses), add_special_tokens=False)["input_ids"]
        out = []
        for p, r, e in zip(p_ids, r_ids, add_eot, strict=True):
            p, (r,) = fit(p, [r + (self.eot if e else [])], self.budget)
            out.append(self.bos + p + r)
        return out

    @torch.no_grad()
    def __call__(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        add_eot: Sequence[bool] | None = None,
    ) -> tuple[torch.Tensor, list[int]]:
        """(rewards (B,) float32, response token counts (B,) after truncation)."""
        add_eot = [True] * len(prompts) if add_eot is None else add_eot
        seqs = self.encode(prompts, responses, add_eot)
        ids, mask = right_pad(seqs, self.tok.pad_token_id)
        device = next(self.rm.parameters()).device
        n_prompt = [
            len(s) for s in self.encode(prompts, [""] * len(prompts), [False] * len(prompts))
        ]
        counts = [len(s) - n for s, n in zip(seqs, n_prompt, strict=True)]
        return end_rewards(self.rm, ids.to(device), mask.to(device)).cpu(), counts


# --- the program ---------------------------------------------------------------------------------
def _device(gpu: int) -> torch.device:
    if torch.cuda.is_available():
        if gpu >= torch.cuda.device_count():
            raise ValueError(f"--gpu {gpu}: only {torch.cuda.device_count()} CUDA devices")
        return torch.device(f"cuda:{gpu}")
    return torch.device("cpu")


def _dtype_name(cfg: InferenceConfig, device: torch.device) -> str:
    if cfg.dtype != "auto":
        return cfg.dtype
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


def _batch_seed(seed: int, first_prompt_id: str) -> int:
    # Sampling noise of a batch depends on the seed and the batch's first prompt, so a resumed run
    # draws the same as an uninterrupted one with the same batch size.
    return int(selection_key(first_prompt_id, seed)[:15], 16)


def _want_gold(cfg: InferenceConfig, examples: Sequence[Any]) -> bool:
    if cfg.gold_score != "auto":
        return cfg.gold_score == "on"
    return dataset_spec(cfg.dataset) == "synthetic-tldr" or all(
        e.prompt_id.startswith("synthetic-tldr/") for e in examples
    )


def _eos_ids(tokenizer: Any, model: Any, cfg: InferenceConfig) -> list[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids.update(int(x) for x in (gen_eos if isinstance(gen_eos, list) else [gen_eos]))
    if cfg.end_of_conversation_token:
        tok = tokenizer(cfg.end_of_conversation_token, add_special_tokens=False)["input_ids"]
        if len(tok) != 1:
            raise ValueError(
                f"--end_of_conversation_token {cfg.end_of_conversation_token!r} must be one token "
                f"to stop generation, got {len(tok)}"
            )
        ids.add(int(tok[0]))
    if not ids:
        raise ValueError(
            f"{cfg.model}: neither the tokenizer nor the generation config has an eos token"
        )
    return sorted(ids)


def _eot_ids(tokenizer: Any, cfg: InferenceConfig) -> list[int]:
    text = cfg.end_of_conversation_token or tokenizer.eos_token
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def _same_vocab(a: Any, b: Any) -> bool:
    from marlhf.data.tokenize import tokenizer_fingerprint

    return tokenizer_fingerprint(a)["vocab_sha256"] == tokenizer_fingerprint(b)["vocab_sha256"]


@dataclass
class _Models:
    policy: Any
    tokenizer: Any
    reward_model: Any
    rm_tokenizer: Any
    device: torch.device


def _load_models(cfg: InferenceConfig, device: torch.device, need_policy: bool) -> _Models:
    from marlhf.config import ModelConfig
    from marlhf.models import TORCH_DTYPES, load_causal_lm, load_tokenizer

    dtype = _dtype_name(cfg, device)
    policy = tok = rm = rm_tok = None
    if need_policy:
        mcfg = ModelConfig(model_name_or_path=cfg.model)
        tok = load_tokenizer(mcfg, padding_side="left")
        policy = load_causal_lm(mcfg, dtype=dtype).to(device).eval()
    if cfg.reward_model:
        from marlhf.reward_model import load_reward_model

        rm, info = load_reward_model(cfg.reward_model, dtype=TORCH_DTYPES[dtype], device=device)
        rm.eval()
        if info.get("rm_type") != "end":
            log.warning(
                "%s is a %s reward model; using its end score",
                cfg.reward_model,
                info.get("rm_type"),
            )
        rm_tok = load_tokenizer(
            ModelConfig(model_name_or_path=cfg.reward_model), padding_side="right"
        )
    return _Models(policy, tok, rm, rm_tok, device)


def _prompt_ids(
    tokenizer: Any, prompts: Sequence[str], max_len: int
) -> tuple[list[list[int]], int]:
    """bos + prompt ids cut from the left to ``max_len`` tokens; and how many were cut."""
    from marlhf.data.tokenize import bos_prefix

    bos = bos_prefix(tokenizer)
    budget = max_len - len(bos)
    if budget < 1:
        raise ValueError(f"--max-prompt-len must exceed {len(bos)}, got {max_len}")
    ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    cut = sum(len(p) > budget for p in ids)
    return [bos + p[len(p) - budget :] if len(p) > budget else bos + p for p in ids], cut


@torch.no_grad()
def generate(
    model: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    cfg: InferenceConfig,
    eos_ids: list[int],
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one response per row.

    prompt_ids, prompt_mask: (B, P) left-padded. Returns (response_ids (B, A) long right-padded
    with ``pad_id`` after the first EOS, action_mask (B, A) bool, ends_with_eos (B,) bool), on CPU.
    """
    from marlhf.rl.rollout import response_mask

    device = next(model.parameters()).device
    out = model.generate(
        input_ids=prompt_ids.to(device),
        attention_mask=prompt_mask.long().to(device),
        do_sample=True,
        temperature=cfg.temperature,
        top_k=cfg.top_k if cfg.top_k > 0 else None,
        top_p=cfg.top_p,
        max_new_tokens=cfg.max_new_tokens,
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
    )
    response = out[:, prompt_ids.shape[1] :].cpu()
    if response.shape[1] == 0:
        response = torch.full((prompt_ids.shape[0], 1), pad_id, dtype=torch.long)
    action_mask, ends_with_eos = response_mask(response, eos_ids)
    response = response.masked_fill(~action_mask, pad_id)
    return response, action_mask, ends_with_eos


@torch.no_grad()
def _macro_items(
    rule: Any,
    models: _Models,
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
    (``ppl``, ``entropy``) get them from the policy itself."""
    from marlhf.macro import TerminationInputs
    from marlhf.macro.render import token_pieces
    from marlhf.rl.rollout import pack_flush_left, response_logprobs_and_entropy

    inputs = TerminationInputs(
        response_ids=response,
        action_mask=action_mask,
        ends_with_eos=ends_with_eos,
        generator=torch.Generator().manual_seed(seed),
    )
    if rule.needs & {"ref_logprobs", "ref_entropy"}:
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


def _progress(total: int, disable: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="inference", unit="prompt", disable=disable, file=sys.stderr)


def run_inference(args: InferenceArgs) -> dict:
    """Run the program; returns the summary (also written to ``<output>.summary.json``)."""
    from marlhf.data.adapters import load_examples

    cfg = args.inference
    spec = dataset_spec(cfg.dataset)
    path = output_path(cfg)
    examples, n_bad = load_examples(spec, cfg.split, skip_bad_rows=cfg.skip_bad_rows)
    if not examples:
        raise ValueError(f"--dataset {cfg.dataset}: no {cfg.split} examples")
    selected = select_prompts(examples, cfg.num_samples, cfg.seed)
    is_code = all("tests" in e.meta for e in selected)
    if not cfg.reward_model and not is_code:
        raise ValueError("--reward-model is required (only APPS can be scored without one)")
    if cfg.ref_scores:
        selected = [e for e in selected if e.chosen is not None and e.rejected is not None]
        if not selected:
            raise ValueError(f"--ref-scores: {cfg.dataset} has no chosen/rejected pairs")
    gold = _want_gold(cfg, selected)

    settings = run_settings(cfg, args.macro, args.code)
    done = prepare_output(path, settings, cfg.overwrite)
    todo = [e for e in selected if e.prompt_id not in done]
    log.info(
        "%s: %d prompts selected, %d already done, %d to run",
        path,
        len(selected),
        len(done),
        len(todo),
    )

    device = _device(cfg.gpu)
    models = _load_models(cfg, device, need_policy=not cfg.ref_scores)
    rule = None
    html_items: list[dict] = []
    if cfg.render_macro and not cfg.ref_scores:
        from marlhf.macro import build_termination

        rule = build_termination(args.macro, models.tokenizer)
    rewarder = None
    if is_code and not cfg.ref_scores:
        from marlhf.code_reward import CodeRewarder

        rewarder = CodeRewarder.from_config(args.code)
    text_scorer = None
    shared_ids = False
    if models.reward_model is not None:
        budget = cfg.max_prompt_len + cfg.max_new_tokens
        text_scorer = TextScorer(
            models.reward_model, models.rm_tokenizer, _eot_ids(models.rm_tokenizer, cfg), budget
        )
        shared_ids = models.tokenizer is not None and _same_vocab(
            models.tokenizer, models.rm_tokenizer
        )
        if models.tokenizer is not None and not shared_ids:
            log.warning(
                "the reward model's vocabulary differs from the policy's: re-tokenising text"
            )

    n_cut = 0
    bar = _progress(len(todo), cfg.disable_progress_bar)
    try:
        for i, start in enumerate(range(0, len(todo), cfg.batch_size)):
            if cfg.max_batches and i >= cfg.max_batches:
                break
            batch = todo[start : start + cfg.batch_size]
            if cfg.ref_scores:
                rows = _ref_rows(batch, text_scorer, gold)
            else:
                rows, items, cut = _generate_rows(
                    batch,
                    cfg,
                    models,
                    text_scorer,
                    shared_ids,
                    rewarder,
                    gold,
                    rule,
                    want_items=len(html_items) < cfg.render_macro,
                )
                n_cut += cut
                html_items += items
            append_rows(path, rows)
            bar.update(len(batch))
    finally:
        bar.close()
        if rewarder is not None:
            rewarder.close()
    if n_cut:
        log.warning(
            "%d prompts longer than --max-prompt-len %d were cut from the left",
            n_cut,
            cfg.max_prompt_len,
        )

    if html_items:
        _write_macro_view(path, html_items[: cfg.render_macro], args.macro)

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


def _write_macro_view(path: str, items: list[dict], macro: MacroConfig) -> None:
    from marlhf.macro.render import macro_groups, plot_length_histogram, render_html

    base = path[: -len(".jsonl")] if path.endswith(".jsonl") else path
    title = f"Macro actions ({macro.termination_condition}, ngram={macro.ngram})"
    render_html(items, base + ".macro.html", title=title)
    lengths = [e - s for it in items for s, e in macro_groups(it["macro_end"])]
    if lengths:
        plot_length_histogram(lengths, base + ".macro_lengths.png")
    log.info("macro-action view: %s.macro.html", base)


def _ref_rows(batch: list[Any], scorer: TextScorer, gold: bool) -> list[dict]:
    prompts = [e.prompt for e in batch]
    chosen_r, chosen_n = scorer(prompts, [e.chosen for e in batch])
    rejected_r, _ = scorer(prompts, [e.rejected for e in batch])
    rows = []
    for b, e in enumerate(batch):
        row = {
            "prompt_id": e.prompt_id,
            "prompt": e.prompt,
            "response": e.chosen,
            "reward": float(chosen_r[b]),
            "chosen_response": e.chosen,
            "chosen_reward": float(chosen_r[b]),
            "rejected_response": e.rejected,
            "rejected_reward": float(rejected_r[b]),
            "response_tokens": chosen_n[b],
            "ends_with_eos": True,
        }
        if gold:
            from marlhf.data.synthetic import gold_score

            row["gold"] = row["chosen_gold"] = gold_score(e.prompt, e.chosen)
            row["rejected_gold"] = gold_score(e.prompt, e.rejected)
        rows.append(row)
    return rows


def _generate_rows(
    batch: list[Any],
    cfg: InferenceConfig,
    models: _Models,
    scorer: TextScorer | None,
    shared_ids: bool,
    rewarder: Any,
    gold: bool,
    rule: Any,
    want_items: bool,
) -> tuple[list[dict], list[dict], int]:
    tok = models.tokenizer
    n = cfg.n_samples_per_prompt if rewarder is not None else 1
    ids, cut = _prompt_ids(tok, [e.prompt for e in batch], cfg.max_prompt_len)
    prompt_ids, prompt_mask = left_pad(ids, tok.pad_token_id)
    if n > 1:  # (B*n, P): each prompt's samples are consecutive rows
        prompt_ids = prompt_ids.repeat_interleave(n, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(n, dim=0)
    torch.manual_seed(_batch_seed(cfg.seed, batch[0].prompt_id))
    eos_ids = _eos_ids(tok, models.policy, cfg)
    response, action_mask, ends = generate(
        models.policy, prompt_ids, prompt_mask, cfg, eos_ids, tok.pad_token_id
    )
    lengths = action_mask.sum(1).tolist()
    texts = tok.batch_decode(response, skip_special_tokens=True)
    prompts = [e.prompt for e in batch for _ in range(n)]

    rm_scores: list[float | None] = [None] * len(texts)
    if models.reward_model is not None:
        if shared_ids:
            rm_scores = score_rollout(
                models.reward_model,
                prompt_ids,
                prompt_mask,
                response,
                action_mask,
                tok.pad_token_id,
            ).tolist()
        else:
            rm_scores = scorer(prompts, texts, ends.tolist())[0].tolist()

    rows: list[dict] = []
    if rewarder is None:
        for b, e in enumerate(batch):
            row = {
                "prompt_id": e.prompt_id,
                "prompt": e.prompt,
                "response": texts[b],
                "reward": rm_scores[b],
                "response_tokens": int(lengths[b]),
                "ends_with_eos": bool(ends[b]),
            }
            if gold:
                from marlhf.data.synthetic import gold_score

                row["gold"] = gold_score(e.prompt, texts[b])
            if cfg.save_token_ids:
                row["response_ids"] = response[b, : lengths[b]].tolist()
            rows.append(row)
        item_rewards = rm_scores
    else:
        from marlhf.code_reward import code_reward, extract_code, parse_tests

        suites = [parse_tests(e.meta["tests"]) for e in batch for _ in range(n)]
        results = rewarder.score([extract_code(t) for t in texts], suites)
        rewards = [code_reward(r, "pass_fraction") for r in results]
        for p, e in enumerate(batch):
            sl = slice(p * n, (p + 1) * n)
            row = {
                "prompt_id": e.prompt_id,
                "prompt": e.prompt,
                "response": texts[p * n],
                "reward": sum(rewards[sl]) / n,
                "responses": texts[sl],
                "rewards": rewards[sl],
                "n_correct": sum(r.total > 0 and r.passed == r.total for r in results[sl]),
                "response_tokens": sum(lengths[sl]) / n,
                "ends_with_eos": float(ends[sl].float().mean()),
            }
            if models.reward_model is not None:
                row["rm_rewards"] = rm_scores[sl]
            if cfg.save_token_ids:
                row["response_ids"] = [
                    response[j, : lengths[j]].tolist() for j in range(p * n, (p + 1) * n)
                ]
            rows.append(row)
        item_rewards = rewards

    items: list[dict] = []
    if want_items and rule is not None:
        items = _macro_items(
            rule,
            models,
            prompt_ids,
            prompt_mask,
            response,
            action_mask,
            ends,
            prompts,
            item_rewards,
            cfg.temperature,
            cfg.seed,
        )
    return rows, items, cut


def main(argv: Sequence[str] | None = None) -> dict:
    """Parse flags (see ``--help``), run, print the summary."""
    from marlhf.cli import parse_config

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_config(InferenceArgs, argv, description=__doc__.strip().splitlines()[0])
    try:
        summary = run_inference(args)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    print(json.dumps(summary, indent=2, sort_keys=True))
    return summary
