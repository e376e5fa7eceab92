"""Tests of the macro-action viewer (marlhf/inference/view.py, ``python -m marlhf.view``) and of the
rule resolution it shares with inference's ``--render-macro`` (marlhf/inference/macro_rule.py)."""

from __future__ import annotations

import base64
import html
import itertools
import json
import re

import pytest
import torch
from transformers import AutoModelForCausalLM

from marlhf.config import ModelConfig
from marlhf.inference import InferenceArgs, InferenceConfig, output_path, read_rows, run_inference
from marlhf.inference.macro_rule import describe, resolve_macro, trained_macro
from marlhf.inference.naming import sidecar
from marlhf.inference.prompts import prompt_token_ids
from marlhf.inference.view import main as view_main
from marlhf.macro.config import MacroConfig
from marlhf.macro.render import macro_groups
from marlhf.models.generation import SamplingConfig
from marlhf.models.load import load_tokenizer
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
            sampling=SamplingConfig(max_prompt_seq_len=64, max_answer_seq_len=12,
                                    generation_backend="hf"),
            batch_size=3, disable_progress_bar=True,
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


def _token_probs(actor, rows: list[dict], settings: dict) -> list[list[float]]:
    """p(a_t | prompt, a_<t) of every response token at the file's temperature, one unpadded forward
    pass per token (a loop: the view scores the batch at once, packed and padded)."""
    model = AutoModelForCausalLM.from_pretrained(actor).eval()
    tok_ids, _ = prompt_token_ids(
        load_tokenizer(ModelConfig(model_name_or_path=str(actor))),
        [r["prompt"] for r in rows],
        int(settings["max_prompt_len"]),
    )
    out = []
    for prompt, row in zip(tok_ids, rows, strict=True):
        resp, probs = row["response_ids"], []
        for t in range(len(resp)):
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prompt + resp[:t]])).logits[0, -1]
            probs.append(
                float(torch.softmax(logits.float() / settings["temperature"], -1)[resp[t]])
            )
        out.append(probs)
    return out


def _separating_threshold(probs: list[float]) -> float:
    """A probability near the median of ``probs`` with none of them within 1e-4 of it."""
    ps = sorted(probs)
    gaps = [(abs(i - len(ps) // 2), (a + b) / 2) for i, (a, b) in enumerate(itertools.pairwise(ps))]
    return min(g for g in gaps if ps[0] < g[1] < ps[-1] and min(abs(p - g[1]) for p in ps) > 1e-4)[
        1
    ]


def test_view_lowprob_cuts_after_the_policys_unlikely_tokens(actor, tmp_path):
    """``lowprob`` in the viewer: a macro action ends at each token the policy sampled with
    probability below --lowprob_threshold (cut after it), at the last token and before the EOS,
    against the policy's probabilities computed token by token."""
    path = _result_file(actor, tmp_path)
    rows = [r for r in read_rows(path) if r.get("response") is not None][:3]
    settings = json.loads(open(sidecar(path, "meta")).read())["settings"]
    probs = _token_probs(actor, rows, settings)
    threshold = _separating_threshold([p for row in probs for p in row])
    flags = ["--termination_condition", "lowprob", "--lowprob_threshold", str(threshold)]
    out = view_main([path, *flags, "--color", "never", "--html", "none", "-n", "3"])
    assert out[0]["rule"].startswith("lowprob")
    for row, p, item in zip(rows, probs, out[0]["items"], strict=True):
        n, eos = len(p), row["ends_with_eos"]
        expected = [q < threshold or t == n - 1 or (eos and t == n - 2) for t, q in enumerate(p)]
        assert item["macro_end"] == expected
    assert any(not e for it in out[0]["items"] for e in it["macro_end"])  # not every token cut


def test_view_refuses_a_file_without_rows(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(SystemExit, match="no response rows"):
        view_main([str(empty), "--model", "tiny"])


# ---------------------------------------------------------------- files that are not clean


def _rows_file(path, rows: list, end: str = "\n") -> str:
    """``rows`` as JSON lines (a str row is written as it is); ``end`` after the last line."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + end, encoding="utf-8")
    return str(path)


_CONTROLS = ("\x1b", "\u202e", "\u2066", "\u2069")


def test_view_shows_control_characters_as_escapes(tmp_path, capsys):
    """A response clearing the screen (ESC [2J) and reversing a file name (U+202E): neither reaches
    the terminal or the page as it is; each shows as its escape."""
    response = "a\x1b[2J b gnp\u202e.exe \u2066x\u2069 end"
    path = _rows_file(tmp_path / "r.jsonl", [{"prompt_id": "p\x1b[1m", "prompt": "q\u202eq",
                                              "response": response}])  # fmt: skip
    for color in ("never", "always"):
        out = view_main([path, "--model", "tiny", "--color", color])
        text = capsys.readouterr().out
        # the view's own colours are the only escape sequences
        shown = re.sub(r"\x1b\[(30;4[36]|0)m", "", text) if color == "always" else text
        assert not any(c in shown for c in _CONTROLS)
        printed = shown.split("\n[0] ", 1)[1].splitlines()[1:]
        bare = "".join(line for line in printed if not line.startswith("wrote ")).replace("|", "")
        # the reference: the response with each control written as Python writes its escape
        assert bare == "a\\x1b[2J b gnp\\u202e.exe \\u2066x\\u2069 end"
        assert "[0] p\\x1b[1m" in shown
    page = open(out[0]["html"], encoding="utf-8").read()
    assert not any(c in page for c in _CONTROLS)
    spans = re.findall(r'<span class="ma"[^>]*>(.*?)</span>', page, re.S)
    assert html.unescape("".join(spans)) == "a\\x1b[2J b gnp\\u202e.exe \\u2066x\\u2069 end"
    assert "q\\u202eq" in page
    assert "".join(out[0]["items"][0]["pieces"]) == response  # the data itself is kept


def test_view_refuses_a_page_that_overwrites_an_input(tmp_path):
    path = _rows_file(tmp_path / "r.jsonl", [{"prompt_id": "a", "response": "hi"}])
    meta = tmp_path / "r.jsonl.meta.json"
    meta.write_text("{}")
    before = (open(path).read(), meta.read_text())
    for target in (path, str(meta), str(tmp_path / "." / "r.jsonl")):
        with pytest.raises(SystemExit, match=r"^error: --html .* would overwrite the input file"):
            view_main([path, "--model", "tiny", "--html", target])
    assert (open(path).read(), meta.read_text()) == before
    other = _rows_file(tmp_path / "s.jsonl", [{"prompt_id": "a", "response": "hi"}])
    with pytest.raises(SystemExit, match="one page for 2 result files"):
        view_main([path, other, "--model", "tiny", "--html", str(tmp_path / "v.html")])


def test_view_rows_not_shown_are_warned_and_an_unterminated_last_row_is_shown(
    tmp_path, capsys, caplog
):
    rows = [{"prompt_id": "a", "response": "one"}, {"prompt_id": "b", "prompt": "x"},
            {"prompt_id": "c", "response": None}, {"prompt_id": "d", "response": "four"}]  # fmt: skip
    path = _rows_file(tmp_path / "r.jsonl", rows, end="")  # the last row without its newline
    out = view_main([path, "--model", "tiny", "--color", "never", "--html", "none"])
    assert ["".join(it["pieces"]) for it in out[0]["items"]] == ["one", "four"]
    assert f'{path} lines 2, 3: no "response" (missing or null); not shown' in caplog.text
    # a half-written last line: inference still running
    with open(path, "a") as f:
        f.write('\n{"prompt_id": "e", "respo')
    caplog.clear()
    out = view_main([path, "--model", "tiny", "--color", "never", "--html", "none"])
    assert len(out[0]["items"]) == 2
    assert f"{path} line 5: a half-written last line (inference still running?)" in caplog.text


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt_id": "a", "response": 5}', 'line 2: field "response" must be a string, got int'),
        ('{"prompt_id": "a", "response": "x", "reward": "high"}',
         'line 2: field "reward" must be a number, got str'),
        ('{"prompt_id": "a", "response": "x", "prompt": ["p"]}',
         'line 2: field "prompt" must be a string, got list'),
        ('{"prompt_id": "a", "response": "x", "response_ids": ["x"]}',
         'line 2: field "response_ids" must be a list of token ids'),
        ('{"prompt_id": "a", "response": "x", "response_ids": [1, 99999999]}',
         'line 2: field "response_ids" holds id 99999999, outside the vocabulary'),
        ('{"prompt_id": "a", "response": "x", "ends_with_eos": "yes"}',
         'line 2: field "ends_with_eos" must be true or false'),
        ('{"prompt_id": "a", "response": "x"', "line 2: not valid JSON at column"),
        ("[1, 2]", "line 2: not a JSON object"),
    ],
)  # fmt: skip
def test_view_errors_name_file_line_and_field(tmp_path, line, message):
    path = _rows_file(tmp_path / "r.jsonl", ['{"prompt_id": "a", "response": "ok"}', line])
    with pytest.raises(SystemExit, match=re.escape(f"error: {path} {message}")):
        view_main([path, "--model", "tiny", "--html", "none"])


def test_view_errors_for_a_missing_file_and_invalid_utf8(tmp_path):
    with pytest.raises(
        SystemExit, match=re.escape(f"error: {tmp_path / 'no.jsonl'}: no such file")
    ):
        view_main([str(tmp_path / "no.jsonl"), "--model", "tiny"])
    path = tmp_path / "r.jsonl"
    path.write_bytes(
        b'{"prompt_id": "a", "response": "ok"}\n{"prompt_id": "b", "response": "\xff"}\n'
    )
    with pytest.raises(SystemExit, match=re.escape(f"error: {path} line 2: not UTF-8 (byte 0xff")):
        view_main([str(path), "--model", "tiny"])


def test_view_without_a_spacy_pipeline_is_one_error_line(tmp_path):
    pytest.importorskip("spacy")
    path = _rows_file(tmp_path / "r.jsonl", [{"prompt_id": "a", "response": "The cat sat."}])
    flags = ["--termination_condition", "parsing", "--parser_backend", "spacy",
             "--spacy_model", str(tmp_path / "no_pipeline")]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        view_main([path, "--model", "tiny", "--html", "none", *flags])
    text = str(exc.value.code)
    assert text.startswith("error: --spacy_model") and "spacy download" in text
    assert "\n" not in text


def test_view_says_where_the_page_is_and_the_page_shows_the_histogram(tmp_path, capsys):
    path = _rows_file(tmp_path / "r.jsonl", [{"prompt_id": "a", "response": "one two three"}])
    out = view_main([path, "--model", "tiny", "--ngram", "2", "--no_terminal"])
    page, png = tmp_path / "r.macro.html", tmp_path / "r.macro_lengths.png"
    assert out[0]["html"] == str(page)
    assert capsys.readouterr().out.strip() == (
        f"wrote {page} (histogram of macro-action lengths: {png})"
    )
    html = page.read_text(encoding="utf-8")
    embedded = re.search(r'<img alt="histogram of macro-action lengths" src="data:image/png;'
                         r'base64,([A-Za-z0-9+/=]+)"', html)  # fmt: skip
    assert embedded and base64.b64decode(embedded[1]) == png.read_bytes()
    n = len(macro_groups(out[0]["items"][0]["macro_end"]))
    assert f"1 responses, {n} macro actions" in html


def test_view_error_for_a_broken_meta_names_it(tmp_path):
    path = _rows_file(tmp_path / "r.jsonl", [{"prompt_id": "a", "response": "ok"}])
    (tmp_path / "r.jsonl.meta.json").write_text("{")
    with pytest.raises(SystemExit, match=re.escape(f"error: {path}.meta.json: not a result file")):
        view_main([path, "--html", "none"])
