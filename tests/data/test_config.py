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
