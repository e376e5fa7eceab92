"""Flags of the inference program: :class:`InferenceConfig` and the parts :class:`InferenceArgs` composes
(the CLI is generated from them by :mod:`marlhf.cli`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from marlhf.config import flag
from marlhf.data.config import DataConfig
from marlhf.data.names import names_help
from marlhf.macro.config import MacroConfig
from marlhf.models.generation import SamplingConfig
from marlhf.rewards.code import CodeRewardConfig

DTYPE_CHOICES = ("auto", "fp32", "fp16", "bf16")
GOLD_CHOICES = ("auto", "on", "off")


@dataclass
class InferenceConfig:
    """Inference: generate for validation prompts and score them (reward model, gold, tests)."""

    proj_path: str = flag(
        ".", "Project directory; results go to <proj_path>/results/...", aliases=("--proj-path",)
    )
    dataset: str = flag(
        "synthetic", f"{names_help()}, or a data spec (registered name or local file/directory)."
    )
    model: str = flag(
        "tiny",
        "Policy: an SFT/PPO checkpoint directory, a hub id, or `tiny`.",
        flag="--model_name_or_path",
    )
    reward_model: str | None = flag(
        None,
        "Reward-model directory (stage 2) that scores the responses. Without one the "
        "responses are only sampled (rows without `reward`; APPS answers are scored by their "
        "tests, the synthetic tasks' by gold).",
        flag="--reward_model_name_or_path",
        aliases=("--reward-model",),
    )
    # the sampling flags of PPO's generation (one source): --max_prompt_seq_len,
    # --max_answer_seq_len, --temperature, --top_k, --top_p, --generation_backend, ...
    sampling: SamplingConfig = field(
        default_factory=lambda: SamplingConfig(
            max_prompt_seq_len=512, max_answer_seq_len=512, generation_backend="hf"
        ),
        metadata={
            "help": {
                "max_prompt_seq_len": "Prompt tokens (bos included); longer prompts lose tokens "
                "from the left.",
                "max_answer_seq_len": "Maximum response tokens.",
            }
        },
    )
    # --data_columns, as the stages read it (marlhf.data.config.DataConfig)
    data: DataConfig = field(
        default_factory=DataConfig,
        metadata={
            "flags": ("data_columns",),
            "help": {
                "data_columns": "Rename the columns of a local --dataset file before its schema "
                "is detected, as ours=theirs: `prompt=query` reads the column `query` as "
                "`prompt` (several: prompt=instruction,chosen=output). The schemas: "
                "marlhf/data/adapters.py."
            },
        },
    )
    apply_chat_template: bool = flag(
        False,
        "Render prompts with the policy tokenizer's chat template (HH turns and "
        "messages lists become messages; other prompts one user message).",
    )
    end_of_conversation_token: str | None = flag(
        None,
        "Extra stop token, also appended to --ref-scores responses (default: the tokenizer's eos).",
    )
    gpu: int = flag(0, "CUDA device index (CPU when no GPU is available).")
    dtype: str = flag(
        "auto",
        "Weights' precision (auto: bf16 on a GPU that has it, else fp32).",
        choices=DTYPE_CHOICES,
    )
    batch_size: int = flag(16, "Prompts per generation call.", aliases=("--batch-size",))
    num_samples: int = flag(2000, "Validation prompts to use (0: all).", aliases=("--num-samples",))
    seed: int = flag(1234, "Sampling seed; also the prompt selection's unless --prompt-seed.")
    prompt_seed: int | None = flag(
        None,
        "Seed of the --num-samples prompt selection (default: --seed). Fix it to "
        "answer the same prompts with several sampling seeds (e.g. the two answer files of "
        "marlhf.data.policy_comparisons).",
        aliases=("--prompt-seed",),
    )
    split: str = flag("eval", "Dataset split.", choices=("eval", "train"))
    skip_bad_rows: bool = flag(False, "Skip malformed dataset rows.")
    ref_scores: bool = flag(
        False,
        "Score the dataset's chosen/rejected responses instead of generating.",
        aliases=("--ref-scores",),
    )
    output: str | None = flag(
        None,
        "Output .jsonl (default <proj_path>/results/<dataset>/temperature=<T>/<model_name>.jsonl).",
    )
    overwrite: bool = flag(False, "Start the output afresh instead of resuming it.")
    gold_score: str = flag(
        "auto",
        "Add the synthetic task's gold score (auto: when the prompts come from synthetic-tldr, synthetic-facts-* or synthetic-verdict-*).",
        choices=GOLD_CHOICES,
    )
    save_token_ids: bool = flag(False, "Also write response_ids (exact token ids) per row.")
    render_macro: int = flag(
        0,
        "Write an HTML view of the macro actions (--termination_condition ...) "
        "of the first N responses of this run.",
        aliases=("--render-macro",),
    )
    n_samples_per_prompt: int = flag(
        1, "APPS: programs sampled per problem.", aliases=("--n-samples-per-prompt",)
    )
    pass_k: tuple[int, ...] = flag((1, 5), "APPS: k values of pass@k.", aliases=("--pass-k",))
    max_batches: int = flag(0, "Stop after N batches (0: all); re-run to continue.")
    disable_progress_bar: bool = flag(False, "No tqdm bar.")

    # --help groups (marlhf.cli.GROUP_ORDER); the fields not named here are "inference"
    HELP_GROUPS: ClassVar[dict[str, str]] = {
        "model": "model", "reward_model": "model", "dtype": "model", "gpu": "performance",
        "dataset": "data", "split": "data", "skip_bad_rows": "data", "num_samples": "data",
        "prompt_seed": "data", "apply_chat_template": "data", "data": "data",
        "sampling": "generation", "seed": "generation", "end_of_conversation_token": "generation",
        "n_samples_per_prompt": "generation", "batch_size": "performance",
        "max_batches": "performance", "proj_path": "logging", "output": "logging",
        "overwrite": "logging", "disable_progress_bar": "logging", "render_macro": "macro actions",
    }  # fmt: skip

    def __post_init__(self) -> None:
        for name in ("batch_size", "n_samples_per_prompt"):
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

    @property
    def selection_seed(self) -> int:
        """The seed that ranks the prompts for --num-samples: --prompt-seed, else --seed."""
        return self.seed if self.prompt_seed is None else self.prompt_seed


@dataclass
class InferenceArgs:
    """All flags of the inference program (the CLI is generated from these parts)."""

    inference: InferenceConfig = field(default_factory=InferenceConfig)
    macro: MacroConfig = field(default_factory=MacroConfig)
    code: CodeRewardConfig = field(default_factory=CodeRewardConfig)
