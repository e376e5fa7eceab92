"""The judge pipeline end to end against a local OpenAI-compatible server, numbers checked by hand."""

import io
import json

import pytest

from judge.fake_openai import FakeOpenAI, shown
from marlhf.judge.cache import JudgeCache
from marlhf.judge.client import RetryPolicy, run_requests
from marlhf.judge.pairing import align_results
from marlhf.judge.prompts import get_template
from marlhf.judge.run import JudgeConfig, build_requests, main, run_judge

SECRET = "sk-test-DO-NOT-LEAK-4242"

# Response markers decide the scripted judge's behaviour per pair (see `judge`).
PAIRS = [
    ("WIN good summary one", "plain summary one"),  # a preferred in both orders -> a
    ("WIN good summary two", "plain summary two"),  # -> a
    ("plain summary three", "WIN good summary three"),  # b preferred -> b
    ("POS first-position bias", "POS other"),  # judge always picks A -> orders disagree -> tie
    ("TIE equal", "TIE equal too"),  # judge says TIE both times -> tie
    ("GARBAGE reply", "GARBAGE other"),  # unparseable -> invalid
]


def judge(messages, n):
    a, b = shown(messages, "A"), shown(messages, "B")
    if "GARBAGE" in a + b:
        return "I think the first one is nicer."
    if "POS" in a:
        return "Reason: first is first.\nVerdict: [[A]]"
    if "TIE" in a:
        return "Reason: same.\nVerdict: [[TIE]]"
    return "Reason: r.\nVerdict: [[A]]" if "WIN" in a else "Reason: r.\nVerdict: [[B]]"


def write_results(tmp_path, pairs=PAIRS, with_ids=True):
    rows_a, rows_b = [], []
    for i, (ra, rb) in enumerate(pairs):
        base = {"prompt": f"SUBREDDIT: r/test\nPOST: story number {i}", "reward": 0.0}
        if with_ids:
            base["prompt_id"] = f"id{i}"
        rows_a.append({**base, "response": ra})
        rows_b.append({**base, "response": rb})
    pa, pb = tmp_path / "model_a.jsonl", tmp_path / "model_b.jsonl"
    pa.write_text("".join(json.dumps(r) + "\n" for r in rows_a))
    pb.write_text("".join(json.dumps(r) + "\n" for r in rows_b[::-1]))  # other order on purpose
    return pa, pb


def config(tmp_path, srv, **kw):
    pa, pb = write_results(tmp_path)
    base = dict(
        model_name_a=str(pa),
        model_name_b=str(pb),
        output=str(tmp_path / "out" / "a-vs-b.jsonl"),
        base_url=srv.base_url if srv else None,
        retry_base_delay=0.001,
        bootstrap=200,
    )
    base.update(kw)
    return JudgeConfig(**base)


def test_both_orders_ties_invalid_and_summary_by_hand(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    log = io.StringIO()
    with FakeOpenAI(judge) as srv:
        s = run_judge(config(tmp_path, srv), log=log, progress=False)
        n_first = len(srv.requests)
        # every pair judged twice, once with each response first
        firsts = {}
        for r in srv.requests:
            a = shown(r["body"]["messages"], "A")
            firsts.setdefault(a.split()[-1], set()).add(a)
        assert n_first == 12
        assert srv.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"
    # wins: pairs 0, 1; loss: 2; ties: 3 (disagreement), 4 (both tie); invalid: 5
    assert (s["n"], s["wins"], s["ties"], s["losses"], s["invalid"]) == (6, 2, 2, 1, 1)
    assert s["win_rate"] == pytest.approx((2 + 2 * 0.5) / 5)
    assert s["position_consistency"] == pytest.approx(4 / 5)
    # valid replies: 10; "A" chosen in pairs 0,1 (once each), 2 (once), 3 (twice), tie in 4
    assert s["first_position_preferred"] == pytest.approx(5 / 10)
    assert s["usage"]["prompt_tokens"] == 1200 and s["usage"]["completion_tokens"] == 120
    assert s["cost_usd"] == pytest.approx((1200 * 5.0 + 120 * 15.0) / 1e6)  # gpt-4o-2024-05-13
    assert s["ci95"][0] <= s["win_rate"] <= s["ci95"][1]

    out = tmp_path / "out" / "a-vs-b.jsonl"
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["outcome"] for r in recs] == ["a", "a", "b", "tie", "tie", "invalid"]
    pos = recs[3]["orders"]
    assert pos["ab"]["verdict"] == "A" and pos["ab"]["model_verdict"] == "a"
    assert pos["ba"]["verdict"] == "A" and pos["ba"]["model_verdict"] == "b"
    assert recs[0]["orders"]["ab"]["reason"] == "r."
    assert recs[5]["orders"]["ab"]["reply"] == "I think the first one is nicer."
    saved = json.loads((tmp_path / "out" / "a-vs-b.jsonl.summary.json").read_text())
    assert saved["wins"] == 2 and saved["template"] == "summarize-v1"
    text = log.getvalue()
    assert "estimate:" in text and "wins=2 ties=2 losses=1 invalid=1" in text

    # re-run: every reply from the cache, the server sees zero new requests, same numbers
    with FakeOpenAI(judge) as srv2:
        s2 = run_judge(config(tmp_path, srv2), log=io.StringIO(), progress=False)
        assert len(srv2.requests) == 0
    assert (s2["wins"], s2["ties"], s2["losses"], s2["invalid"]) == (2, 2, 1, 1)
    assert s2["usage"]["replies_cached"] == 12 and s2["cost_usd"] == 0

    # the key is in no file written
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert SECRET not in f.read_text(), f
    assert SECRET not in text


def test_resume_after_interruption(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    with FakeOpenAI(judge) as srv:
        cfg = config(tmp_path, srv)
        # interrupt a first run after 5 replies (as Ctrl-C would), through the real client path
        items = build_requests(
            align_results(cfg.model_name_a, cfg.model_name_b),
            get_template("summarize"),
            cfg.judge_model,
        )
        count = []

        def stop(_res):
            count.append(1)
            if len(count) == 5:
                raise KeyboardInterrupt

        cache_dir = tmp_path / "out" / ".judge_cache"  # the default next to --output
        with pytest.raises(KeyboardInterrupt):
            run_requests(
                [it.request for it in items],
                base_url=srv.base_url,
                api_key=SECRET,
                model=cfg.judge_model,
                cache=JudgeCache(cache_dir),
                concurrency=1,
                on_done=stop,
                retry=RetryPolicy(base_delay=0.001),
            )
        assert len(JudgeCache(cache_dir)) == 5
        before = len(srv.requests)
        s = run_judge(cfg, log=io.StringIO(), progress=False)
        assert len(srv.requests) - before == 12 - 5
    assert s["usage"]["replies_cached"] == 5
    assert (s["wins"], s["ties"], s["losses"], s["invalid"]) == (2, 2, 1, 1)


def test_failures_are_invalid_and_retried_next_run(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    broken = {"on": True}

    def flaky(messages, n):
        if broken["on"] and shown(messages, "A") == "WIN good summary one":
            return ("status", 503)
        return judge(messages, n)

    with FakeOpenAI(flaky) as srv:
        s = run_judge(config(tmp_path, srv, max_retries=1), log=io.StringIO(), progress=False)
        assert s["invalid"] == 2 and s["usage"]["failed"] == 1 and s["usage"]["retries"] == 1
        recs = [json.loads(x) for x in (tmp_path / "out" / "a-vs-b.jsonl").read_text().splitlines()]
        assert "HTTP 503" in recs[0]["orders"]["ab"]["error"]
        broken["on"] = False
        before = len(srv.requests)
        s2 = run_judge(config(tmp_path, srv), log=io.StringIO(), progress=False)
        assert len(srv.requests) - before == 1  # only the failed request is redone
    assert s2["invalid"] == 1 and s2["wins"] == 2


def test_dry_run_prints_estimate_only(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    log = io.StringIO()
    cfg = config(
        tmp_path, None, dry_run=True, price_input=1.0, price_output=2.0, judge_model="local"
    )
    est = run_judge(cfg, log=log, progress=False)["estimate"]
    assert est["requests_to_send"] == 12
    assert est["output_tokens_est"] == 12 * get_template("summarize").expected_output_tokens
    assert est["cost_usd_est"] == pytest.approx(
        (est["input_tokens_est"] * 1.0 + est["output_tokens_est"] * 2.0) / 1e6
    )
    assert 12 * 150 < est["input_tokens_est"] < 12 * 600  # ~ characters / 4 of each prompt
    assert not (tmp_path / "out" / "a-vs-b.jsonl").exists()
    assert "estimate:" in log.getvalue()
    unknown = run_judge(
        config(tmp_path, None, dry_run=True, judge_model="local"), log=log, progress=False
    )
    assert unknown["estimate"]["cost_usd_est"] is None
    limited = run_judge(config(tmp_path, None, dry_run=True, limit=2), log=log, progress=False)
    assert limited["estimate"]["requests_to_send"] == 4


def test_webgpt_per_criterion(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)

    def web(messages, n):
        a_is_win = "WIN" in shown(messages, "A")
        w = "A" if a_is_win else "B"
        # accuracy follows the WIN marker, coherence always picks position A, usefulness ties
        return (
            f"Reason: r.\nFactual accuracy: [[{w}]]\nCoherence: [[A]]\n"
            f"Overall usefulness: [[TIE]]\nVerdict: [[{w}]]"
        )

    pairs = [("WIN a", "b1"), ("a2", "WIN b")]
    pa, pb = write_results(tmp_path, pairs)
    with FakeOpenAI(web) as srv:
        cfg = JudgeConfig(
            model_name_a=str(pa),
            model_name_b=str(pb),
            output=str(tmp_path / "w.jsonl"),
            base_url=srv.base_url,
            dataset="webgpt",
            bootstrap=50,
        )
        s = run_judge(cfg, log=io.StringIO(), progress=False)
        assert "[Answer A]" in srv.requests[0]["body"]["messages"][-1]["content"]
    assert (s["wins"], s["losses"]) == (1, 1)
    crit = s["criteria"]
    assert (crit["Factual accuracy"]["wins"], crit["Factual accuracy"]["losses"]) == (1, 1)
    assert crit["Coherence"]["ties"] == 2 and crit["Overall usefulness"]["ties"] == 2


def test_mismatched_files_error_via_cli(tmp_path, capsys):
    pa, pb = write_results(tmp_path, with_ids=False)
    lines = pb.read_text().splitlines()[1:]
    pb.write_text("\n".join(lines) + "\n")
    rc = main(
        [
            "--model_name_a",
            str(pa),
            "--model_name_b",
            str(pb),
            "--output",
            str(tmp_path / "o.jsonl"),
            "--dry-run",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "model_a.jsonl" in err and "model_b.jsonl" in err and "story number" in err


def test_config_validation_names_flag(tmp_path):
    with pytest.raises(ValueError, match="--concurrency"):
        JudgeConfig(model_name_a="a", model_name_b="b", output="o", concurrency=0)
    with pytest.raises(ValueError, match="--dataset"):
        JudgeConfig(model_name_a="a", model_name_b="b", output="o", dataset="tldr")
    assert "sk-" not in repr(JudgeConfig(model_name_a="a", model_name_b="b", output="o", sk="sk-x"))
