import dataclasses
import doctest
from dataclasses import dataclass, field

import pytest

import marlhf.cli as cli
from marlhf.cli import build_parser, config_from_dict, config_to_dict, parse_config
from marlhf.config import DeepSpeedConfig, LoggingConfig, ModelConfig, OptimConfig
from marlhf.config_file import CONFIG_MAX_VALUES


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


# ---------------------------------------------------------------- shared parts composed into a part


@dataclass
class _Lr:
    lr: float = field(default=1e-3, metadata={"help": "learning rate"})
    wd: float = field(default=0.0, metadata={"help": "weight decay"})

    def __post_init__(self):
        if self.lr < 0:
            raise ValueError(f"--lr must be >= 0, got {self.lr}")


@dataclass
class _Two:
    actor: _Lr = field(default_factory=_Lr, metadata={"prefix": "actor_"})
    critic: _Lr = field(
        default_factory=lambda: _Lr(lr=0.5),
        metadata={"prefix": "critic_", "flags": ("lr",), "help": {"lr": "the critic's rate"}},
    )


@dataclass
class _TwoStage:
    two: _Two = field(default_factory=_Two)


def test_prefixed_parts_take_their_flags_defaults_and_help_from_the_composition():
    parser = build_parser(_TwoStage)
    flags = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    assert {"--actor_lr", "--actor_wd", "--critic_lr"} <= set(flags)
    assert "--critic_wd" not in flags and "--lr" not in flags  # not a flag of the composition
    assert flags["--critic_lr"].default == 0.5  # the composition's default instance
    assert flags["--critic_lr"].help == "the critic's rate" and flags["--actor_lr"].help == (
        "learning rate"
    )
    cfg = parse_config(_TwoStage, ["--actor_lr", "0.25", "--critic_lr", "2"])
    assert cfg.two.actor == _Lr(lr=0.25) and cfg.two.critic == _Lr(lr=2.0)


def test_a_prefixed_parts_error_names_the_prefixed_flag(capsys):
    with pytest.raises(SystemExit):
        parse_config(_TwoStage, ["--critic_lr", "-1"])
    err = capsys.readouterr().err
    assert "--critic_lr must be >= 0, got -1.0" in err and " --lr " not in err


def test_round_trip_dict_of_nested_parts():
    cfg = parse_config(_TwoStage, ["--actor_wd", "0.1"])
    assert config_to_dict(cfg) == {
        "two": {"actor": {"lr": 1e-3, "wd": 0.1}, "critic": {"lr": 0.5, "wd": 0.0}}
    }
    assert config_from_dict(_TwoStage, config_to_dict(cfg)) == cfg


def test_one_source_per_flag():
    """No part of a stage re-declares a field of the shared parts: each such flag is defined once,
    in config.py (or data/, macro/), and composed."""
    from marlhf.data.config import DataConfig
    from marlhf.stages.ppo.config import PPOStageConfig
    from marlhf.stages.reward.config import RewardStageConfig
    from marlhf.stages.sft.config import SFTConfig

    shared = (ModelConfig, OptimConfig, DeepSpeedConfig, LoggingConfig, DataConfig)
    shared_names = {f.name for cls in shared for f in dataclasses.fields(cls)}

    def own_fields(cls):
        for f in dataclasses.fields(cls):
            tp = cli._unwrap_optional(cli.typing.get_type_hints(cls)[f.name])[0]
            if cli._is_part(tp):
                yield from ([] if tp in shared else own_fields(tp))
            else:
                yield cls.__name__, f.name

    for stage in (SFTConfig, RewardStageConfig, PPOStageConfig):
        clash = [(c, n) for c, n in own_fields(stage) if n in shared_names]
        assert clash == [], stage.__name__


def test_ppo_flags_of_the_shared_parts_are_theirs():
    """The PPO stage's shared flags are the shared parts' fields (same help), with PPO's defaults."""
    from marlhf.stages.ppo.config import PPOStageConfig

    flags = {a.option_strings[0]: a for a in build_parser(PPOStageConfig)._actions}
    assert flags["--dtype"].help == dataclasses.fields(ModelConfig)[3].metadata["help"]
    assert flags["--lr_scheduler_type"].default == "linear"  # SFT's is cosine
    assert build_parser(_Stage)._option_string_actions["--lr_scheduler_type"].default == "cosine"
    assert (
        flags["--actor_dropout"].default == 0.0
        and flags["--critic_model_name_or_path"].default == ""
    )


# ---------------------------------------------------------------- --config files: what is refused


def _config_error(tmp_path, capsys, name: str, text: str) -> str:
    """The error line of parsing ``_Stage`` with a config file ``name`` holding ``text``."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SystemExit):
        parse_config(_Stage, ["--config", str(path)])
    return capsys.readouterr().err


def test_config_key_given_twice_is_refused_with_its_line(tmp_path, capsys):
    pytest.importorskip("yaml")
    err = _config_error(
        tmp_path, capsys, "c.yaml", "seed: 1\nlearning_rate: 0.5\nlearning_rate: 0.25\n"
    )
    assert "c.yaml line 3: learning_rate is given twice (first on line 2)" in err
    err = _config_error(tmp_path, capsys, "c.json", '{"learning_rate": 0.5, "learning_rate": 0.25}')
    assert "c.json: learning_rate is given twice" in err
    # two spellings of one flag, or a flag given flat and by part
    err = _config_error(tmp_path, capsys, "d.yaml", "learning_rate: 0.5\nlearning-rate: 0.25\n")
    assert "learning_rate and learning-rate both set --learning_rate" in err
    err = _config_error(tmp_path, capsys, "e.json", '{"seed": 3, "optim": {"seed": 4}}')
    assert "seed and optim.seed both set --seed" in err


def test_config_naming_another_config_is_refused(tmp_path, capsys):
    pytest.importorskip("yaml")
    err = _config_error(tmp_path, capsys, "c.yaml", "learning_rate: 0.5\nconfig: other.yaml\n")
    assert "config names another config file" in err and "its own --config" in err


def test_config_alias_bomb_is_bounded(tmp_path, capsys):
    """Six levels of nine aliases each: 9**6 = 531441 values in one flag's value from seven lines."""
    import time

    pytest.importorskip("yaml")
    lines = ["lora_module_name:", "  - &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"  - &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 7)]
    t0 = time.perf_counter()
    err = _config_error(tmp_path, capsys, "bomb.yaml", "\n".join(lines) + "\n")
    assert time.perf_counter() - t0 < 10
    assert f"value of lora_module_name expands to more than {CONFIG_MAX_VALUES}" in err
    # an alias of a scalar is fine
    ok = tmp_path / "ok.yaml"
    ok.write_text("learning_rate: &lr 0.5\nweight_decay: *lr\n")
    cfg = parse_config(_Stage, ["--config", str(ok)])
    assert (cfg.optim.learning_rate, cfg.optim.weight_decay) == (0.5, 0.5)


# ---------------------------------------------------------------- registries and --plugin files


REGISTRY: dict[str, object] = {"a": object()}


@dataclass
class _Registered:
    name: str = field(default="a", metadata={"help": "a registered name", "choices": REGISTRY})


@dataclass
class _RegisteredStage:
    p: _Registered = field(default_factory=_Registered)


def test_a_registry_is_the_live_choices_of_its_flag(capsys):
    parser = build_parser(_RegisteredStage)
    REGISTRY["b"] = object()  # registered after the parser was built
    try:
        assert parser.parse_args(["--name", "b"]).__dict__["p.name"] == "b"
        with pytest.raises(SystemExit):
            parser.parse_args(["--help"])
        assert "--name {a,b}" in capsys.readouterr().out
        with pytest.raises(SystemExit):
            parser.parse_args(["--name", "c"])
        assert "invalid choice: 'c' (choose from 'a', 'b')" in capsys.readouterr().err
    finally:
        del REGISTRY["b"]


PLUGIN = """
from marlhf.macro.rules import Rule, register_rule

@register_rule("cli_test_rule")
class CliTestRule(Rule):
    description = "a rule of the CLI's test"
"""


@pytest.fixture
def plugin_file(tmp_path):
    """A plugin file registering a rule; the rule and the module leave afterwards."""
    import sys

    from marlhf.macro.rules import RULES
    from marlhf.plugins import plugin_module_name

    path = tmp_path / "cli_rules.py"
    path.write_text(PLUGIN)

    def forget():
        RULES.pop("cli_test_rule", None)
        sys.modules.pop(plugin_module_name(path), None)

    yield path, forget
    forget()


def test_plugin_files_are_imported_before_the_flags_are_checked(plugin_file, tmp_path, capsys):
    import json

    from marlhf.macro.config import MacroConfig

    @dataclass
    class _MacroStage:
        macro: MacroConfig = field(default_factory=MacroConfig)

    path, forget = plugin_file
    # the rule is named before the file that registers it
    cfg = parse_config(
        _MacroStage, ["--termination_condition", "cli_test_rule", "--plugin", str(path)]
    )
    assert cfg.macro.termination_condition == "cli_test_rule" and cfg.macro.plugin == (str(path),)
    saved = config_to_dict(cfg)
    forget()
    # a --config file (run_config.json) names its plugins as well
    run_config = tmp_path / "run_config.json"
    run_config.write_text(json.dumps(saved))
    assert parse_config(_MacroStage, ["--config", str(run_config)]) == cfg
    forget()
    assert config_from_dict(_MacroStage, saved) == cfg
    forget()
    with pytest.raises(SystemExit):
        parse_config(_MacroStage, ["--termination_condition", "cli_test_rule"])
    assert "invalid choice: 'cli_test_rule'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config(_MacroStage, ["--plugin", str(tmp_path / "none.py")])
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith(f"error: --plugin {tmp_path / 'none.py'}: no such file")
