"""Typed configuration of the GPU acceptance run (``python -m marlhf.gpu_check``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from marlhf.config import flag

PARTS = ("environment", "pipeline", "decode", "ppo_update", "mismatch")


@dataclass
class CheckConfig:
    """What the acceptance run measures and at which sizes."""

    output_dir: str = flag(
        "output/gpu_check", "Where gpu_check.json, gpu_check.md and the runs' directories go."
    )
    size: str = flag(
        "auto",
        "Pipeline model: `1b` (a random-initialised Gemma-architecture model, hidden "
        "2048 x 16 layers, about 0.9 B parameters with the bundled tokenizer), `cpu` (the "
        "embedded tiny model, one step each), HIDDENxLAYERS (e.g. 1024x8), or `auto`: 1b on "
        "CUDA, cpu without a GPU.",
    )
    steps: int = flag(0, "Training steps of each pipeline run (0: 2 on CUDA, 1 on CPU).")
    parts: tuple[str, ...] = flag(
        PARTS, f"Parts to run, in the order given, any of {', '.join(PARTS)}."
    )
    bandwidth: float = flag(
        0.0,
        "GPU memory bandwidth in bytes/s for the decode bound (0: from the GPU's "
        "name, e.g. 3.35e12 for an H100 SXM).",
    )
    stage_timeout_s: int = flag(900, "Wall-clock limit of each pipeline or benchmark process.")

    def __post_init__(self) -> None:
        bad = [p for p in self.parts if p not in PARTS]
        if bad:
            raise ValueError(f"--parts: unknown {bad}; choose from {PARTS}")
        if self.steps < 0:
            raise ValueError(f"--steps must be >= 0, got {self.steps}")
        if self.size not in ("auto", "cpu", "1b") and not _parse_size(self.size):
            raise ValueError(f"--size must be auto, cpu, 1b or HIDDENxLAYERS, got {self.size!r}")


def _parse_size(text: str) -> tuple[int, int] | None:
    parts = text.lower().split("x")
    if len(parts) == 2 and all(p.isdigit() and int(p) > 0 for p in parts):
        return int(parts[0]), int(parts[1])
    return None


@dataclass
class GPUCheckStageConfig:
    """The GPU acceptance run."""

    check: CheckConfig = field(default_factory=CheckConfig)


@dataclass(frozen=True)
class Sizes:
    """The sizes of one acceptance run, resolved for the device (:func:`resolve_sizes`)."""

    device: str  # "cuda" or "cpu"
    model: tuple[int, int] | None  # pipeline model (hidden, layers); None: the embedded tiny model
    steps: int
    seq: int  # SFT / RM --max_seq_len
    prompt: int  # PPO --max_prompt_seq_len
    answer: int  # PPO --max_answer_seq_len
    train_batch: int
    generation_batch: int
    # the decode and PPO-update benchmarks (TRL's shapes on CUDA, see docs/gpu.md)
    bench_hidden: int
    bench_layers: int
    bench_vocab: int
    bench_batch: int
    bench_prompt: int
    bench_new_tokens: int
    bench_steps: int


def resolve_sizes(cfg: CheckConfig, cuda: bool) -> Sizes:
    """The run's sizes: the GPU recipe on CUDA, the CPU one (a few minutes on 2 cores) else."""
    size = cfg.size if cfg.size != "auto" else ("1b" if cuda else "cpu")
    model = None if size == "cpu" else (2048, 16) if size == "1b" else _parse_size(size)
    if cuda:
        return Sizes(
            "cuda", model, cfg.steps or 2, 256, 128, 64, 8, 16,
            2048, 16, 32000, 64, 128, 128, 5,
        )  # fmt: skip
    return Sizes(
        "cpu", model, cfg.steps or 1, 192, 160, 8, 2, 4,
        64, 2, 512, 4, 16, 16, 2,
    )  # fmt: skip
