"""human-eval.py driven as a person would: through a pipe (one line per key) and a pseudo-terminal
(single keypresses), including quitting and resuming. The scripted "person" reads which model's text
is shown as A (responses start with `from-a` / `from-b`) and answers by preference, so the summary
checks that positions are mapped back to models."""

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from marlhf.judge.human import HumanEvalConfig, outcome_of, plan, run_human_eval
from marlhf.judge.pairing import align_results

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "quit: "


def write(tmp_path, n):
    pa, pb = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    pa.write_text(
        "".join(
            json.dumps({"prompt": f"prompt {i}", "response": f"from-a {i}"}) + "\n"
            for i in range(n)
        )
    )
    pb.write_text(
        "".join(
            json.dumps({"prompt": f"prompt {i}", "response": f"from-b {i} longer"}) + "\n"
            for i in range(n)
        )
    )
    return pa, pb


class Session:
    def __init__(self, args, tty):
        cmd = [sys.executable, str(ROOT / "evaluation" / "human-eval.py"), *args]
        self.tty = tty
        if tty:
            master, slave = os.openpty()
            self.proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, cwd=ROOT)
            os.close(slave)
            self.rfd = self.wfd = master
        else:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
            self.rfd, self.wfd = self.proc.stdout.fileno(), self.proc.stdin.fileno()
        self.text = ""
        self.pos = 0

    def _pump(self, timeout):
        r, _, _ = select.select([self.rfd], [], [], timeout)
        if not r:
            return False
        try:
            data = os.read(self.rfd, 65536)
        except OSError:  # EIO: pty closed after the child exited
            return None
        if not data:
            return None
        self.text += data.decode().replace("\r\n", "\n")
        return True

    def until(self, marker, timeout=30.0):
        end = time.monotonic() + timeout
        while marker not in self.text[self.pos :]:
            got = self._pump(max(0.0, end - time.monotonic()))
            if got is None or time.monotonic() > end:
                raise AssertionError(f"{marker!r} not seen; output so far:\n{self.text}")
        i = self.text.index(marker, self.pos) + len(marker)
        chunk, self.pos = self.text[self.pos : i], i
        return chunk

    def key(self, k):
        os.write(self.wfd, (k if self.tty else k + "\n").encode())

    def answer(self, want):
        """Read one item and press the key for `want` ('a', 'b', 'tie', 'skip')."""
        chunk = self.until(PROMPT)
        shown_a = chunk.rsplit("[A]\n", 1)[1].split("\n", 1)[0]
        if want in ("a", "b"):
            self.key("1" if shown_a.startswith(f"from-{want}") else "2")
        else:
            self.key({"tie": "3", "skip": "4"}[want])
        return chunk

    def finish(self, timeout=30.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self._pump(0.2) is None:
                break
        rc = self.proc.wait(timeout=max(1.0, end - time.monotonic()))
        if self.tty:
            os.close(self.rfd)
        else:
            self.proc.stdin.close()
            self.proc.stdout.close()
        return rc


def test_pipe_quit_and_resume(tmp_path):
    pa, pb = write(tmp_path, 6)
    out = tmp_path / "human.jsonl"
    args = [
        "--model_name_a",
        str(pa),
        "--model_name_b",
        str(pb),
        "--output",
        str(out),
        "--num",
        "4",
    ]
    s = Session(args, tty=False)
    assert "item 1/4" in s.answer("a")
    assert "item 2/4" in s.answer("b")
    s.until(PROMPT)
    s.key("q")
    assert s.finish() == 0
    saved = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["outcome"] for r in saved] == ["a", "b"]
    assert all(r["outcome"] == outcome_of(r["choice"], r["shown_first"]) for r in saved)

    s = Session(args, tty=False)  # resumes at item 3
    first = s.answer("tie")
    assert "resuming: 2 of 4" in first and "item 3/4" in first and "item 1/4" not in first
    s.until(PROMPT)
    s.key("x")
    assert "unknown key" in s.until(PROMPT)
    s.key("4")
    assert s.finish() == 0
    assert "wins=1 ties=1 losses=1 invalid=1" in s.text and "skipped=1" in s.text
    summary = json.loads((tmp_path / "human.jsonl.summary.json").read_text())
    assert (summary["wins"], summary["ties"], summary["losses"], summary["skipped"]) == (1, 1, 1, 1)
    assert summary["win_rate"] == 0.5
    saved = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(saved) == 4 and len({r["key"] for r in saved}) == 4
    assert {r["shown_first"] for r in saved} == {"a", "b"}  # the order really was randomised


def test_pty_single_keypress(tmp_path):
    pa, pb = write(tmp_path, 3)
    out = tmp_path / "human.jsonl"
    s = Session(
        ["--model_a", str(pa), "--model_b", str(pb), "--output", str(out), "--num", "3"], tty=True
    )
    s.answer("a")
    s.answer("a")
    s.answer("b")
    assert s.finish() == 0
    assert "wins=2 ties=0 losses=1" in s.text
    assert [json.loads(x)["outcome"] for x in out.read_text().splitlines()] == ["a", "a", "b"]


def test_plan_depends_only_on_prompts_and_seed(tmp_path):
    pa, pb = write(tmp_path, 20)
    pairs = align_results(pa, pb)
    p1 = plan(pairs, 10, 42)
    p2 = plan(pairs[::-1], 10, 42)
    assert [(i.pair.key, i.shown_first) for i in p1] == [(i.pair.key, i.shown_first) for i in p2]
    assert [i.pair.key for i in plan(pairs, 10, 1)] != [i.pair.key for i in p1]
    assert len({i.pair.key for i in p1}) == 10


def test_eof_on_pipe_stops_cleanly(tmp_path):
    import io

    pa, pb = write(tmp_path, 2)
    cfg = HumanEvalConfig(
        model_name_a=str(pa), model_name_b=str(pb), output=str(tmp_path / "h.jsonl")
    )
    out = io.StringIO()
    s = run_human_eval(cfg, stdin=io.StringIO("3\n"), stdout=out)
    assert s["ties"] == 1 and s["n"] == 1
    assert "note: only 2 aligned prompts" in out.getvalue()


def test_output_naming_an_input_is_refused_and_untouched(tmp_path):
    import io

    import pytest

    from marlhf.judge.pairing import PairingError

    pa, pb = write(tmp_path, 3)
    before = pb.read_bytes()
    for output in (pb, tmp_path / "b"):  # the file itself, or a summary that would land on it
        if output.name == "b":
            (tmp_path / "b.summary.json").write_text("{}")
            cfg = HumanEvalConfig(
                model_name_a=str(pa),
                model_name_b=str(tmp_path / "b.summary.json"),
                output=str(output),
            )
        else:
            cfg = HumanEvalConfig(model_name_a=str(pa), model_name_b=str(pb), output=str(output))
        with pytest.raises(PairingError, match="would overwrite the input file --model_name_b"):
            run_human_eval(cfg, stdin=io.StringIO("1\n" * 3), stdout=io.StringIO())
    assert pb.read_bytes() == before


def test_files_matched_by_prompt_text_say_so(tmp_path):
    import io

    pa, pb = write(tmp_path, 2)
    rows = [json.loads(x) for x in pa.read_text().splitlines()]
    pa.write_text(
        "".join(json.dumps({**r, "prompt_id": str(i)}) + "\n" for i, r in enumerate(rows))
    )
    out = io.StringIO()
    cfg = HumanEvalConfig(
        model_name_a=str(pa), model_name_b=str(pb), output=str(tmp_path / "h.jsonl")
    )
    run_human_eval(cfg, stdin=io.StringIO("1\n1\n"), stdout=out)
    assert "has no prompt_id" in out.getvalue() and "matched by prompt text" in out.getvalue()
