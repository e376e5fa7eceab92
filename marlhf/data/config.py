"""Data options shared by the SFT, reward-model and PPO stages (flag names as in DeepSpeed-Chat)."""

from __future__ import annotations

from dataclasses import dataclass

from marlhf.config import flag


@dataclass
class DataConfig:
    """Which datasets, how they are split between the three phases and how they are tokenised."""

    data_path: tuple[str, ...] = flag(
        ("synthetic-tldr",),
        "Datasets to blend: registered names / hub ids (openai/summarize_from_feedback, "
        "Dahoas/full-hh-rlhf, Dahoas/rm-static, openai/webgpt_comparisons, codeparrot/apps, "
        "synthetic-tldr), reasoning-gym:NAME[:SIZE] (a reasoning-gym task, generated; pip "
        "install reasoning-gym) or local json/jsonl/parquet files or directories; "
        "'adapter:path' forces the adapter of a local file.",
    )
    data_columns: tuple[str, ...] = flag(
        (),
        "Rename the columns of local --data_path files before their schema is "
        "detected, as ours=theirs: `prompt=query` reads the column `query` as `prompt` "
        "(several: prompt=instruction,chosen=output). The schemas: marlhf/data/adapters.py.",
    )
    data_split: str = flag(
        "2,4,4", "Relative sizes of the SFT, reward-model and PPO parts, e.g. '2,4,4'."
    )
    data_seed: int | None = flag(
        None,
        "Seed of the phase split (which rows go to SFT, reward model and PPO); "
        "default: the stage's --seed. Set it to vary --seed while every stage and run keeps "
        "the same rows.",
    )
    data_output_path: str = flag("./data_cache", "Directory of the tokenised-data cache.")
    max_seq_len: int = flag(512, "Maximum tokens of prompt + response (SFT and RM).")
    end_of_conversation_token: str | None = flag(
        None, "Appended once after every response; default: the tokenizer's eos token."
    )
    skip_bad_rows: bool = flag(False, "Skip (and count) malformed rows instead of raising.")
    sft_include_prompt_loss: bool = flag(
        False, "Also train SFT on the prompt tokens (default: response tokens only)."
    )
    max_samples: int = flag(0, "Cap on examples per dataset per split, for quick runs (0 = all).")
    apply_chat_template: bool = flag(
        False,
        "Render prompts with the tokenizer's chat template (conversational data: HH "
        "turns and messages lists become messages; other prompts one user message).",
    )
    webgpt_skip_ties: bool = flag(
        False, "WebGPT: skip comparisons with equal scores (default: answer_0 is chosen)."
    )

    def column_mapping(self) -> dict[str, str]:
        """``--data_columns`` as ``{their column: ours}``."""
        return {theirs: ours for ours, theirs in (m.split("=", 1) for m in self.data_columns)}

    def split_seed(self, seed: int) -> int:
        """The seed of the phase split: ``--data_seed``, or the stage's ``seed`` when it is unset."""
        return seed if self.data_seed is None else self.data_seed

    def __post_init__(self) -> None:
        if isinstance(self.data_path, str):
            raise ValueError("--data_path must be a tuple of strings, got a single string")
        if not self.data_path or any(not p for p in self.data_path):
            raise ValueError(f"--data_path must name at least one dataset, got {self.data_path!r}")
        parts = self.data_split.split(",")
        try:
            weights = [float(p) for p in parts]
        except ValueError:
            raise ValueError(
                f"--data_split must be comma-separated numbers like '2,4,4', got {self.data_split!r}"
            ) from None
        if len(weights) != 3 or any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(
                f"--data_split needs three non-negative weights with a positive sum, "
                f"got {self.data_split!r}"
            )
        if self.max_seq_len < 2:
            raise ValueError(f"--max_seq_len must be >= 2, got {self.max_seq_len}")
        if self.max_samples < 0:
            raise ValueError(f"--max_samples must be >= 0, got {self.max_samples}")
        targets = []
        for m in self.data_columns:
            ours, sep, theirs = m.partition("=")
            if not sep or not ours.strip() or not theirs.strip() or ours != ours.strip():
                raise ValueError(
                    f"--data_columns takes ours=theirs pairs such as prompt=query, got {m!r}"
                )
            targets.append(ours)
        if len(set(targets)) != len(targets):
            raise ValueError(f"--data_columns names a column twice: {list(self.data_columns)}")
        if self.end_of_conversation_token == "":
            raise ValueError("--end_of_conversation_token must not be empty (omit it for eos)")
