import dataclasses
import doctest
from dataclasses import dataclass, field

import pytest

import marlhf.cli as cli
from marlhf.cli import build_parser, config_from_dict, config_to_dict, parse_config
from marlhf.config import DeepSpeedConfig, LoggingConfig, ModelConfig, OptimConfig


@dataclass
class _Stage:
    """Test stage."""

    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    ds: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    log: LoggingConfig = field(default_factory=LoggingConfig)


def test_doctest():
    assert doctest.testmod(cli).failed == 0


def test_original_step1_flags_parse():
    # the flags of the original DeepSpeed-Chat step-1 script
    argv = (
        "--model_name_or_path google/gemma-2b --per_device_train_batch_size 4 "
        "--per_device_eval_batch_size 4 --learning_rate 5e-5 --weight_decay 0.1 "
        "--num_train_epochs 3 --gradient_accumulation_steps 16 --lr_scheduler_type cosine "
        "--num_warmup_steps 0 --warmup_ratio 0.1 --seed 1234 --gradient_checkpointing "
        "--zero_stage 3 --offload --dtype bf16 --lora_dim 8 --lora_module_name layers. "
        "--only_optimize_lora --enable_tensorboard --output_dir /tmp/x --local_rank=0"
    ).split()
    cfg = parse_config(_Stage, argv)
    assert cfg.model.model_name_or_path == "google/gemma-2b"
    assert cfg.model.gradient_checkpointing is True
    assert cfg.ds.zero_stage == 3 and cfg.ds.offload is True and cfg.ds.local_rank == 0
    assert cfg.model.dtype == "bf16" and cfg.model.lora_dim == 8 and cfg.model.only_optimize_lora
    assert cfg.optim.gradient_accumulation_steps == 16 and cfg.optim.warmup_ratio == 0.1
    assert cfg.log.enable_tensorboard is True


def test_bool_negation_and_explicit_value():
    cfg = parse_config(_Stage, ["--no_enable_tensorboard"])
    assert cfg.log.enable_tensorboard is False
    cfg = parse_config(_Stage, ["--enable_tensorboard", "false"])
    assert cfg.log.enable_tensorboard is False


def test_validation_error_names_flag(capsys):
    with pytest.raises(SystemExit):
        parse_config(_Stage, ["--zero_stage", "5"])
    assert "--zero_stage" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config(_Stage, ["--dtype", "fp8"])


def test_unknown_flag_rejected():
    with pytest.raises(SystemExit):
        parse_config(_Stage, ["--not_a_flag", "1"])


def test_duplicate_flags_across_parts_rejected():
    @dataclass
    class A:
        x: int = 1

    @dataclass
    class B:
        x: int = 2

    @dataclass
    class S:
        a: A = field(default_factory=A)
        b: B = field(default_factory=B)

    with pytest.raises(TypeError, match="--x"):
        build_parser(S)


def test_aliases_and_tuples_and_optional():
    @dataclass
    class P:
        parsing_cutoff: int = field(default=5, metadata={"aliases": ("--parser_cutoff",)})
        choices: tuple[int, ...] = (1, 2)
        paths: tuple[str, ...] = ("a",)
        thr: float | None = None

    @dataclass
    class S:
        p: P = field(default_factory=P)

    cfg = parse_config(
        S, ["--parser_cutoff", "7", "--choices", "2", "3,5", "--paths", "x", "y", "--thr", "0.5"]
    )
    assert cfg.p.parsing_cutoff == 7 and cfg.p.choices == (2, 3, 5) and cfg.p.paths == ("x", "y")
    assert cfg.p.thr == 0.5
    assert parse_config(S, ["--thr", "none"]).p.thr is None


def test_round_trip_dict():
    cfg = parse_config(_Stage, ["--zero_stage", "2", "--learning_rate", "1e-3"])
    again = config_from_dict(_Stage, config_to_dict(cfg))
    assert dataclasses.asdict(again) == dataclasses.asdict(cfg)


def test_help_lists_the_choices_of_a_flag(capsys):
    from marlhf.stages.ppo.config import PPOStageConfig

    with pytest.raises(SystemExit):
        parse_config(PPOStageConfig, ["--help"])
    out = capsys.readouterr().out
    assert "--kl_estimator {k1,k2,k3}" in out
    assert "--termination_condition {" in out and "entropy" in out
