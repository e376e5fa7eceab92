"""The documentation: the mkdocs site builds with --strict (no broken link, image or anchor), the README
and docs speak of what the project does (no work sessions, tracker numbers or days of work), and
every flag the guide names is a flag of some program."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_architecture import EXTERNAL_REFERENCE, HISTORY, history_lines

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# Beyond the library's pattern: section signs of a tracker's items, the bare word "session" and
# "run 1 (" headings.
DOC_HISTORY = re.compile(HISTORY.pattern + r"|§|\bsession\b|\brun \d+ \(", re.IGNORECASE)

# Flags in the guide that belong to other programs, with the program.
EXTERNAL_FLAGS = {
    "--num_gpus": "deepspeed launcher",
    "--module": "deepspeed launcher",
    "--hostfile": "deepspeed launcher",
    "--no_ssh": "deepspeed launcher",
    "--node_rank": "deepspeed launcher",
    "--master_addr": "deepspeed launcher",
    "--master_port": "deepspeed launcher",
    "--plan": "marlhf preflight ppo: the memory plan's flags, taken before the stage's own",
    "--gpu_memory": "marlhf preflight ppo: the memory plan's flags, taken before the stage's own",
    "--no-deps": "pip",
    "--strict": "mkdocs build",
    "--lerning_rate": "troubleshooting: the misspelled flag of the example message",
    "--port": "scripts/reward_server.py",
    "--rule": "scripts/reward_server.py",
}


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_site_builds_strict(tmp_path):
    """`mkdocs build --strict` fails on a link to a missing page or image and on a missing anchor
    (mkdocs.yml's validation section), so links between the docs cannot rot."""
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (
        "mkdocs build --strict failed (pip install -r requirements-docs.txt if mkdocs is missing):\n"
        + proc.stdout
        + proc.stderr
    )
    assert (tmp_path / "site" / "guide" / "index.html").is_file()
    assert (tmp_path / "site" / "results" / "index.html").is_file()


def test_strict_build_catches_a_broken_anchor(tmp_path):
    """The check above can fail: a copy of the docs with one link to a missing anchor is refused."""
    site = tmp_path / "project"
    site.mkdir()
    (site / "mkdocs.yml").write_text((ROOT / "mkdocs.yml").read_text())
    docs = site / "docs"
    docs.mkdir()
    for path in DOCS.rglob("*.md"):
        target = docs / path.relative_to(DOCS)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    for path in DOCS.rglob("*.png"):
        target = docs / path.relative_to(DOCS)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    guide = docs / "guide" / "index.md"
    guide.write_text(guide.read_text() + "\n[gone](../results.md#no-such-question)\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=site,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "no-such-question" in proc.stdout + proc.stderr


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    missing = {p for p in pages if p not in nav}
    assert missing == set(), f"add these pages to the nav of mkdocs.yml: {sorted(missing)}"


def test_readme_and_docs_speak_of_what_the_project_does_not_of_its_history():
    assert [line for path in doc_files() for line in history_lines(path, DOC_HISTORY)] == []


def test_doc_history_pattern_matches_what_it_forbids():
    for text in (
        "## PPO vs MA-PPO, run 2 (session 2)",
        "(issue #12)",
        "issue 11, part 1",
        "(§2)",
        "the first session's flags",
        "today's trainer",
        "parsing skipped as before",
        "before #14",
    ):
        assert DOC_HISTORY.search(EXTERNAL_REFERENCE.sub("", text)), text
    for text in (
        "the tissue",
        "verl RFC #7244 shows",
        "(TRL issue #6789 is this mismatch)",
        "run the sweep again",
        "3 min 14 s on one thread",
        "color:#555",
    ):
        assert not DOC_HISTORY.search(EXTERNAL_REFERENCE.sub("", text)), text


def program_flags() -> set[str]:
    """Every flag (and alias) of every `marlhf` program, from its --help, underscores for dashes."""
    from marlhf.commands import COMMANDS, main

    flags: set[str] = set()
    for name in COMMANDS:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            main([name, "--help"])
        flags.update(
            f.replace("-", "_") for f in re.findall(r"(?<![\w-])--[a-z][\w-]*", out.getvalue())
        )
    return flags


def test_every_flag_in_the_guide_is_a_flag_of_some_program():
    """A flag named in docs/guide/ that no program has (a typo, a renamed flag) fails here;
    `--no_X` is the negation of the boolean flag `--X`."""
    known = program_flags()
    assert {"__ngram", "__actor_zero_stage", "__base_url", "__render_macro"} <= {
        f.replace("-", "_") for f in known
    }
    unknown = []
    for path in sorted((DOCS / "guide").glob("*.md")):
        for flag in sorted(set(re.findall(r"(?<![\w-])--[a-z][\w-]*", path.read_text()))):
            norm = flag.replace("-", "_")
            negated = "__" + norm[len("__no_") :] if norm.startswith("__no_") else None
            if norm in known or negated in known or flag in EXTERNAL_FLAGS:
                continue
            unknown.append(f"{path.relative_to(ROOT)}: {flag}")
    assert unknown == []


def test_make_docs_is_offline(tmp_path):
    """``make docs`` builds with the installed environment's mkdocs and never installs (an install
    reaches the network); without one it says to run ``make install`` first."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    mkdocs = venv / "bin" / "mkdocs"
    mkdocs.write_text('#!/bin/sh\necho built "$@"\n')
    mkdocs.chmod(0o755)
    # no .installed stamp, as on a fresh clone: what make would run (-n runs nothing) has no install
    plan = subprocess.run(["make", "-n", "--no-print-directory", "docs", f"VENV={venv}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert plan.returncode == 0 and "mkdocs build" in plan.stdout
    assert "pip" not in plan.stdout and "-m venv" not in plan.stdout, plan.stdout
    run = subprocess.run(["make", "--no-print-directory", "docs", f"VENV={venv}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "built build --strict --site-dir site" in run.stdout and "pip" not in run.stdout
    missing = subprocess.run(["make", "--no-print-directory", "docs", f"VENV={tmp_path / 'none'}"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert missing.returncode != 0 and "pip" not in missing.stdout
    assert "run make install first" in missing.stderr
