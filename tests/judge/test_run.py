"""The judge pipeline end to end against a local OpenAI-compatible server, numbers checked by hand."""

import io
import json

import pytest

from marlhf.judge.cache import JudgeCache
from marlhf.judge.client import RetryPolicy, run_requests
from marlhf.judge.config import JudgeConfig
from marlhf.judge.cost import build_requests
from marlhf.judge.pairing import align_results
from marlhf.judge.prompts import get_template
from marlhf.judge.run import main, run_judge
from tests.support.fake_openai import FakeOpenAI, shown

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
        JudgeConfig(model_name_a="a", model_name_b="b", output="o", dataset="reddit")
    assert "sk-" not in repr(JudgeConfig(model_name_a="a", model_name_b="b", output="o", sk="sk-x"))


# --- unparseable replies, failures, empty responses, output paths, cached spend, dataset names ----


def test_unparseable_counted_apart_and_asked_again_with_flag(tmp_path, monkeypatch):
    """An unparseable reply is counted as `unparseable` (not `failed`); it stays cached (a parser
    fix needs no new request), and --retry_unparseable asks again and replaces it in the cache."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    fixed = {"on": False}

    def judge2(messages, n):
        if fixed["on"] and "GARBAGE" in shown(messages, "A") + shown(messages, "B"):
            return "Reason: now in format.\nVerdict: [[TIE]]"
        return judge(messages, n)

    log = io.StringIO()
    with FakeOpenAI(judge2) as srv:
        s = run_judge(config(tmp_path, srv), log=log, progress=False)
        assert (s["invalid"], s["unparseable"], s["failed"], s["replies_unparseable"]) == (
            1,
            1,
            0,
            2,
        )
        assert (
            "unparseable 1, failed 0" in log.getvalue() and "--retry_unparseable" in log.getvalue()
        )
        fixed["on"] = True
        s2 = run_judge(config(tmp_path, srv), log=io.StringIO(), progress=False)
        assert len(srv.requests) == 12 and s2["unparseable"] == 1  # no flag: cached, not re-sent
        s3 = run_judge(
            config(tmp_path, srv, retry_unparseable=True), log=io.StringIO(), progress=False
        )
        assert len(srv.requests) == 14  # exactly the two unparseable orders asked again
        assert (s3["invalid"], s3["unparseable"], s3["ties"]) == (0, 0, 3)
        s4 = run_judge(config(tmp_path, srv), log=io.StringIO(), progress=False)
        assert len(srv.requests) == 14 and s4["ties"] == 3  # the new replies replaced the old ones


@pytest.mark.parametrize("failure", ["401", "connection refused"])
def test_every_request_failed_exits_nonzero(tmp_path, monkeypatch, capsys, failure):
    """When nothing could be judged the CLI exits 1 with a message (not 0 with "win rate n/a");
    the outputs are still written."""
    import socket

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    pa, pb = write_results(tmp_path)
    out = tmp_path / "o.jsonl"
    argv = ["--model_name_a", str(pa), "--model_name_b", str(pb), "--output", str(out)]
    argv += ["--max_retries", "1", "--retry_base_delay", "0.001"]
    if failure == "401":
        with FakeOpenAI(lambda m, n: ("status", 401, "invalid key {auth}")) as srv:
            rc = main([*argv, "--base_url", srv.base_url])
    else:
        with socket.socket() as sock:  # a port nobody listens on
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        rc = main([*argv, "--base_url", f"http://127.0.0.1:{port}/v1"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "every judge request failed" in err
    assert ("HTTP 401" if failure == "401" else "connection error") in err
    assert SECRET not in err
    saved = json.loads((tmp_path / "o.jsonl.summary.json").read_text())
    assert saved["failed"] == saved["n"] == 6 and saved["win_rate"] is None


def test_empty_responses_warned_and_counted(tmp_path, monkeypatch):
    """Empty or whitespace-only responses are judged as given but warned about, with the
    file and line, and counted in the summary."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    pairs = [("WIN a", ""), ("   \n ", "plain"), ("WIN c", "plain c")]
    pa, pb = write_results(tmp_path, pairs)
    log = io.StringIO()
    with FakeOpenAI(judge) as srv:
        cfg = JudgeConfig(
            model_name_a=str(pa),
            model_name_b=str(pb),
            output=str(tmp_path / "o.jsonl"),
            base_url=srv.base_url,
            bootstrap=50,
        )
        s = run_judge(cfg, log=log, progress=False)
        assert len(srv.requests) == 6  # still judged
    assert s["empty_responses"] == {"a": 1, "b": 1}
    text = log.getvalue()
    # b is written in reverse order: its empty response (pair 0) is on line 3
    assert f"warning: {pa}: 1 empty or whitespace-only response(s) (line 2)" in text
    assert f"warning: {pb}: 1 empty or whitespace-only response(s) (line 3)" in text


@pytest.mark.parametrize("which", ["a", "b", "summary-of-b"])
def test_output_naming_an_input_is_refused(tmp_path, monkeypatch, capsys, which):
    """--output equal to an input (or whose summary file is one) is refused before anything is
    written; the input is unchanged."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    pa, pb = write_results(tmp_path)
    if which == "summary-of-b":
        target = tmp_path / "b"
        pb = pb.rename(tmp_path / "b.summary.json")
    else:
        target = (
            pa if which == "a" else tmp_path / "sub" / ".." / pb.name
        )  # same file, other spelling
    before = {p: p.read_bytes() for p in (pa, pb)}
    with FakeOpenAI(judge) as srv:
        rc = main(
            ["--model_name_a", str(pa), "--model_name_b", str(pb), "--output", str(target)]
            + ["--base_url", srv.base_url]
        )
        assert len(srv.requests) == 0
    err = capsys.readouterr().err
    assert rc == 2 and "would overwrite the input file" in err and "--output" in err
    assert {p: p.read_bytes() for p in (pa, pb)} == before


def test_rerun_keeps_the_spend_of_cached_replies(tmp_path, monkeypatch):
    """A re-run served from the cache reports this run's cost (0) and what the replies it used cost
    when they were bought (the spend stays in the summary, not usage and cost 0)."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    with FakeOpenAI(judge) as srv:
        s1 = run_judge(config(tmp_path, srv), log=io.StringIO(), progress=False)
        s2 = run_judge(config(tmp_path, srv), log=io.StringIO(), progress=False)
    paid = (
        12 * 100 * 5.0 + 12 * 10 * 15.0
    ) / 1e6  # 12 replies x (100, 10) tokens, gpt-4o-2024-05-13
    assert s1["cost_usd"] == pytest.approx(paid) and s1["cost_usd_cached"] == 0
    assert s1["cost_usd_total"] == pytest.approx(paid)
    assert s2["cost_usd"] == 0 and s2["usage"]["prompt_tokens"] == 0
    assert (s2["usage"]["cached_prompt_tokens"], s2["usage"]["cached_completion_tokens"]) == (
        1200,
        120,
    )
    assert s2["cost_usd_cached"] == pytest.approx(paid) and s2["cost_usd_total"] == pytest.approx(
        paid
    )
    saved = json.loads((tmp_path / "out" / "a-vs-b.jsonl.summary.json").read_text())
    assert saved["cost_usd_total"] == pytest.approx(paid)


def test_dataset_names_and_aliases(tmp_path, monkeypatch):
    """The judge takes the shared dataset names and aliases (`hh` as inference does)."""
    from marlhf.judge.config import template_for

    assert template_for("hh") == template_for("hh-rlhf") == "hh-rlhf"
    assert template_for("tldr") == template_for("synthetic") == "summarize"
    assert template_for("openai/webgpt_comparisons") == "webgpt"
    with pytest.raises(ValueError, match="no template for code"):
        JudgeConfig(model_name_a="a", model_name_b="b", output="o", dataset="apps")
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    with FakeOpenAI(judge) as srv:
        s = run_judge(config(tmp_path, srv, dataset="hh"), log=io.StringIO(), progress=False)
        assert "[Reply A]" in srv.requests[0]["body"]["messages"][-1]["content"]
    assert s["template"] == "hh-rlhf-v1"


@pytest.mark.parametrize(
    ("extra", "noted"),
    [([], False), (["--dataset", "webgpt"], False), (["--dataset", "summarize"], True)],
)
def test_webgpt_script_notes_only_a_dataset_it_was_given(tmp_path, capsys, extra, noted):
    """gpt4-webgpt-eval.py notes an ignored --dataset only when one was passed."""
    pa, pb = write_results(tmp_path)
    argv = ["--model_name_a", str(pa), "--model_name_b", str(pb), "--output", str(tmp_path / "o")]
    assert main([*argv, "--dry-run", *extra], force_template="webgpt") == 0
    assert ("ignored" in capsys.readouterr().err) == noted


def test_sk_warns_that_the_key_shows_in_the_process_list(tmp_path, monkeypatch, capsys):
    """``--sk KEY`` (the original judge's flag) still works, but a key on the command line is seen
    by every user of the machine: a warning says so and points to OPENAI_API_KEY; the key itself
    is never printed."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    pa, pb = write_results(tmp_path)
    argv = ["--model_name_a", str(pa), "--model_name_b", str(pb)]
    argv += ["--output", str(tmp_path / "o.jsonl"), "--dry-run"]
    assert main([*argv, "--sk", SECRET]) == 0
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("warning: --sk")]
    assert "process list" in line and "OPENAI_API_KEY" in line
    assert SECRET not in err
    assert main(argv) == 0
    assert "--sk" not in capsys.readouterr().err
