import pytest

from marlhf.data.config import DataConfig


def test_defaults():
    cfg = DataConfig()
    assert cfg.data_path == ("synthetic-tldr",) and cfg.data_split == "2,4,4"
    assert cfg.max_seq_len == 512 and cfg.end_of_conversation_token is None


@pytest.mark.parametrize(
    ("kw", "flag"),
    [
        ({"data_split": "2,4"}, "--data_split"),
        ({"data_split": "a,b,c"}, "--data_split"),
        ({"data_split": "0,0,0"}, "--data_split"),
        ({"max_seq_len": 1}, "--max_seq_len"),
        ({"max_samples": -1}, "--max_samples"),
        ({"data_path": ()}, "--data_path"),
        ({"end_of_conversation_token": ""}, "--end_of_conversation_token"),
    ],
)
def test_validation_names_flag(kw, flag):
    with pytest.raises(ValueError, match=flag):
        DataConfig(**kw)


def test_data_seed_defaults_to_the_stage_seed():
    assert DataConfig().data_seed is None and DataConfig().split_seed(42) == 42
    assert DataConfig(data_seed=7).split_seed(42) == 7
    assert DataConfig(data_seed=0).split_seed(42) == 0  # 0 is a seed, not "unset"


@pytest.mark.parametrize(
    ("module", "stage", "seed_of"),
    [
        ("marlhf.stages.sft.config", "SFTConfig", lambda c: c.optim.seed),
        ("marlhf.stages.reward.config", "RewardStageConfig", lambda c: c.optim.seed),
        ("marlhf.stages.ppo.config", "PPOStageConfig", lambda c: c.ppo.optim.seed),
    ],
)
def test_every_stage_takes_data_seed(module, stage, seed_of):
    import importlib

    from marlhf.cli import parse_config

    cls = getattr(importlib.import_module(module), stage)
    cfg = parse_config(cls, ["--seed", "3", "--data_seed", "7"])
    assert seed_of(cfg) == 3 and cfg.data.split_seed(seed_of(cfg)) == 7
    cfg = parse_config(cls, ["--seed", "3"])
    assert cfg.data.data_seed is None and cfg.data.split_seed(seed_of(cfg)) == 3
