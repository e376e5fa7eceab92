"""Tests of the macro-action viewer (marlhf/inference/view.py, ``python -m marlhf.view``) and of the
rule resolution it shares with inference's ``--render-macro`` (marlhf/inference/macro_rule.py)."""

from __future__ import annotations

import json
import re

import pytest

from marlhf.inference import InferenceArgs, InferenceConfig, output_path, read_rows, run_inference
from marlhf.inference.macro_rule import describe, resolve_macro, trained_macro
from marlhf.inference.view import main as view_main
from marlhf.macro.config import MacroConfig
from marlhf.macro.render import macro_groups
from marlhf.models.zoo import build_tiny
from marlhf.rewards.code import CodeRewardConfig

CORPUS = [
    "POST\nSubreddit: r/cats\nMy cat Tom is ten years old and gained weight.\nTL;DR: ",
    "my cat gained weight and I need diet advice",
] * 10


@pytest.fixture(scope="module")
def actor(tmp_path_factory):
    """A tiny policy saved like PPO's actor/: with a run_config.json whose rule is fixed n = 5."""
    root = tmp_path_factory.mktemp("view")
    path = build_tiny(root / "mappo" / "actor", CORPUS)
    cfg = {"macro": {"termination_condition": "fixed", "ngram": 5, "ngram_choices": [1, 2]}}
    (path / "run_config.json").write_text(json.dumps(cfg))
    return path


def _result_file(actor, tmp_path, **kw) -> str:
    args = InferenceArgs(
        InferenceConfig(
            proj_path=str(tmp_path), dataset="synthetic", model=str(actor), num_samples=3,
            max_new_tokens=12, max_prompt_len=64, batch_size=3, disable_progress_bar=True,
            save_token_ids=True, **kw,
        ),
        MacroConfig(),
        CodeRewardConfig(),
    )  # fmt: skip
    run_inference(args)
    return output_path(args.inference)


def test_trained_rule_read_and_overridden(actor, tmp_path):
    cfg, path = trained_macro(str(actor))
    assert (cfg.termination_condition, cfg.ngram, cfg.ngram_choices) == ("fixed", 5, (1, 2))
    assert path == actor / "run_config.json"
    # nothing given: the trained rule; a given field replaces only that field
    assert resolve_macro(str(actor), MacroConfig())[0].ngram == 5
    over, source = resolve_macro(str(actor), MacroConfig(ngram=1), given={"ngram"})
    assert over.ngram == 1 and "--ngram" in source and "run_config.json" in source
    # a model without a saved rule: the flags themselves
    plain = build_tiny(tmp_path / "sft", CORPUS)
    assert resolve_macro(str(plain), MacroConfig(ngram=3))[0].ngram == 3
    assert trained_macro("tiny") is None
    assert describe(MacroConfig(ngram=5)) == "fixed n=5"


def test_render_macro_uses_the_trained_rule(actor, tmp_path):
    """Inference's --render-macro on an n = 5 actor cuts 5-token macro actions without the flag."""
    path = _result_file(actor, tmp_path, render_macro=3)
    html = open(path[: -len(".jsonl")] + ".macro.html").read()
    assert "fixed n=5" in html and "run_config.json" in html
    spans = re.findall(r'title="macro \d+, (\d+) tokens"', html)
    rows = read_rows(path)
    # every macro action has 5 tokens but the last of a response (and the EOS alone)
    expected = []
    for r in rows:
        n = r["response_tokens"]
        body = n - 1 if r["ends_with_eos"] else n
        expected += [5] * (body // 5) + ([body % 5] if body % 5 else [])
        expected += [1] if r["ends_with_eos"] else []
    assert [int(s) for s in spans] == expected


def test_view_cli_terminal_and_html(actor, tmp_path, capsys):
    path = _result_file(actor, tmp_path)
    out = view_main([path, "--color", "never"])
    text = capsys.readouterr().out
    assert "fixed n=5" in text and "run_config.json" in text
    assert out[0]["html"].endswith(".macro.html")
    item = out[0]["items"][0]
    lens = [e - s for s, e in macro_groups(item["macro_end"])]
    assert all(n == 5 for n in lens[:-2])
    # without colour, a bar follows each macro action of the printed response
    printed = "".join(
        "".join(item["pieces"][s:e]) + "|" for s, e in macro_groups(item["macro_end"])
    )
    assert printed in text
    # a flag given on the command line overrides the trained rule
    out = view_main([path, "--ngram", "2", "--color", "never", "--html", str(tmp_path / "v.html")])
    assert out[0]["rule"] == "fixed n=2"
    assert (tmp_path / "v.html").exists() and (tmp_path / "v_lengths.png").exists()


def test_view_refuses_a_file_without_rows(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(SystemExit, match="no response rows"):
        view_main([str(empty), "--model", "tiny"])
