"""The documentation: the mkdocs site builds with --strict (no broken link, image or anchor), the README
and docs speak of what the project does (no work sessions, tracker numbers or days of work), and
every flag the guide names is a flag of some program."""

from __future__ import annotations

import contextlib
import glob
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_architecture import EXTERNAL_REFERENCE, HISTORY, history_lines

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# Beyond the library's pattern: section signs of a tracker's items, the bare word "session",
# "run 1 (" headings, "now" (a page says what holds, not what changed) and commit hashes (a commit
# id, or a word of 7-40 hex digits with both a digit and a letter).
DOC_HISTORY = re.compile(
    HISTORY.pattern
    + r"|§|\bsession\b|\brun \d+ \(|\bnow\b|\bcommit [0-9a-f]{7,40}\b"
    + r"|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b",
    re.IGNORECASE,
)

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
    """The README, the benchmarks' README and every page of the site."""
    return [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted(DOCS.rglob("*.md"))]


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
        "the static decoder is now the default",
        "on the tree before the step optimisations (commit 8395007)",
        "checked out at 3f9a2c1d",
    ):
        assert DOC_HISTORY.search(EXTERNAL_REFERENCE.sub("", text)), text
    for text in (
        "the tissue",
        "verl RFC #7244 shows",
        "(TRL issue #6789 is this mismatch)",
        "run the sweep again",
        "3 min 14 s on one thread",
        "color:#555",
        "a known quantity; snow; nowhere",
        "seed 1234, 2,100 CPU s, 0.0049 per step, deadbeef",
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


# The repository's top-level directories: a backticked path that starts with one of them names a
# file or directory of the repository.
REPO_DIRS = ("marlhf", "tests", "benchmarks", "docs", "scripts", "training", "inference", "evaluation",
             ".ci")  # fmt: skip
_FENCE = re.compile(r"^\s*(```|~~~)")


def code_spans(text: str) -> list[tuple[int, str]]:
    """(line number, code) of every inline code span, fenced code line and indented code line."""
    spans, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
        elif fenced or line.startswith("    ") and not line.lstrip().startswith(("-", "*", "|")):
            spans.append((number, line))
        else:
            spans += [(number, m[2]) for m in re.finditer(r"(`+)(.+?)\1", line)]
    return spans


def _expand(token: str) -> list[str]:
    """``a_{x,y}.sh`` -> ``a_x.sh``, ``a_y.sh`` (shell brace alternatives, nested ones too)."""
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    return [
        p for alt in m[1].split(",") for p in _expand(token[: m.start()] + alt + token[m.end() :])
    ]


def path_tokens(code: str) -> list[str]:
    """The words of a code span that name repository paths, braces expanded; ``../x`` words too
    (they point outside the repository, which a page of it must not)."""
    out = []
    for word in code.split():
        word = word.strip("\"'()[],;").split("::")[0].rstrip(".:")
        word = word.split("=", 1)[-1]  # --plot=docs/x.png
        if word.startswith("../"):
            out.append(word)
        elif "/" in word and word.split("/")[0] in REPO_DIRS:
            out += _expand(word)
    return out


def is_placeholder(path: str) -> bool:
    """A path that stands for many (``docs/<page>.md``, ``$DIR``, ``a|b``, ``...``) or whose part
    is an upper-case name for the reader to choose (``marlhf/X/config.py``, ``tests/OUT_DIR``)."""
    if any(c in path for c in "<>$|…") or "..." in path:
        return True
    return any(re.fullmatch(r"[A-Z][A-Z0-9_]*", part) for part in path.split("/"))


def dead_paths(files: list[Path], root: Path = ROOT) -> list[str]:
    """`file:line: path` for every backticked repository path that does not exist under `root`.

    Checked: the words of inline code spans and of code blocks that start with a top-level
    directory of the repository (REPO_DIRS) and hold a `/`, after stripping quotes, brackets,
    trailing punctuation, a pytest ``::test`` suffix and a ``--flag=`` prefix; shell braces are
    expanded (``run_{gemma,tiny}.sh`` names two files) and a word with ``*`` or ``?`` must match
    some path. Left out: placeholders (is_placeholder) and outputs, which live under directories
    that are not the repository's (``output/``, ``out/``, ``site/``, ``runs/``, ``/tmp``, ``.venv``).
    A word starting with ``../`` always fails: a page must not point outside the repository."""
    dead = []
    for path in files:
        for number, code in code_spans(path.read_text()):
            for word in path_tokens(code):
                if word.startswith("../"):
                    found = False
                elif is_placeholder(word):
                    continue
                elif any(c in word for c in "*?"):
                    found = bool(glob.glob(word, root_dir=root))
                else:
                    found = (root / word).exists()
                if not found:
                    dead.append(f"{path.relative_to(root)}:{number}: {word}")
    return dead


def test_every_repository_path_in_the_docs_exists():
    """A file or directory named in backticks in the README or a docs page (`tests/x/test_y.py`,
    `marlhf/data/bundled/tiny_base`) exists in the repository, so a moved or removed file cannot
    leave a dead pointer behind; and no page points outside the repository (`../x`)."""
    assert dead_paths(doc_files()) == []


def test_dead_path_check_finds_what_it_should(tmp_path):
    """The check above can fail: on a tree with one real file it passes that file (braced, globbed,
    with a test id, in a code block), finds the missing ones and a pointer outside, and skips
    placeholders and outputs."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("")
    (tmp_path / "tests" / "test_b.py").write_text("")
    page = tmp_path / "page.md"
    page.write_text(
        "Run `tests/test_a.py::test_x`, `tests/test_{a,b}.py`, `tests/test_*.py` and\n"
        "`python -m pytest tests/test_gone.py` (`tests/test_{a,c}.py`); see `../shared/STYLE.md`.\n"
        "Outputs: `output/demo/report.md`, `tests/OUT_DIR/x`, `tests/<name>.py`, `docs/*.md`.\n"
        "\n```bash\npython tests/test_b.py --plot=tests/missing.png\n```\n"
    )
    assert dead_paths([page], root=tmp_path) == [
        "page.md:2: tests/test_gone.py",
        "page.md:2: tests/test_c.py",
        "page.md:2: ../shared/STYLE.md",
        "page.md:3: docs/*.md",
        "page.md:6: tests/missing.png",
    ]


def dead_modules(files: list[Path], root: Path = ROOT) -> list[str]:
    """`file:line: name` for every backticked dotted name of the package (`marlhf.models.decode`,
    `marlhf.pipeline.demo.PPO_FLAGS`) whose module is missing, or whose first name after the
    module does not occur in that module's source (a moved function or constant)."""
    dead = []
    for path in files:
        for number, code in code_spans(path.read_text()):
            for name in re.findall(r"(?<![\w./-])marlhf(?:\.\w+)+", code):
                parts = name.split(".")
                found = None
                for i in range(len(parts), 0, -1):
                    base = root.joinpath(*parts[:i])
                    for source in (base.with_suffix(".py"), base / "__init__.py"):
                        if found is None and source.is_file():
                            found = (i, source)
                if found is None or found[0] == 1 and len(parts) > 1:
                    dead.append(f"{path.relative_to(root)}:{number}: {name}")
                elif found[0] < len(parts):
                    attr = parts[found[0]]
                    if not re.search(rf"\b{attr}\b", found[1].read_text()):
                        dead.append(f"{path.relative_to(root)}:{number}: {name}")
    return dead


def test_every_module_name_in_the_docs_exists():
    """A backticked `marlhf.x.y` or `marlhf.x.y.NAME` in the README or a docs page names a module of
    the package (and a name its source defines or imports)."""
    assert dead_modules(doc_files()) == []


def test_dead_module_check_finds_what_it_should(tmp_path):
    (tmp_path / "marlhf" / "models").mkdir(parents=True)
    (tmp_path / "marlhf" / "__init__.py").write_text("")
    (tmp_path / "marlhf" / "models" / "__init__.py").write_text("")
    (tmp_path / "marlhf" / "models" / "decode.py").write_text("def sample():\n    pass\n")
    page = tmp_path / "page.md"
    page.write_text(
        "`marlhf.models.decode.sample`, `python -m marlhf.models.decode`, `marlhf.models`;\n"
        "`marlhf.decode.sample`, `marlhf.models.decode.lean_parts`, `marlhf.gone`.\n"
    )
    assert dead_modules([page], root=tmp_path) == [
        "page.md:2: marlhf.decode.sample",
        "page.md:2: marlhf.models.decode.lean_parts",
        "page.md:2: marlhf.gone",
    ]


def make_test_sentences(text: str) -> list[str]:
    """The sentences of a page that say what `make test` runs."""
    flat = " ".join(text.split())
    return [s for s in re.split(r"(?<=[.;])\s+", flat) if "`make test` runs" in s]


def test_pages_say_make_test_runs_the_vllm_lane_beside_the_main_suite():
    """The Makefile's `test` target runs the vLLM suite in the background beside the main suite (two
    lanes, one per core); every page that says what `make test` runs says so, none that it runs
    the vLLM suite after the main one."""
    recipe = (ROOT / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert re.search(r"test-vllm.*\)\s*&", recipe, re.DOTALL), recipe
    sentences = [s for path in doc_files() for s in make_test_sentences(path.read_text())]
    assert len(sentences) >= 2, sentences  # the README and the vLLM page
    for sentence in sentences:
        assert "two lanes" in sentence and "beside" in sentence, sentence
        assert not re.search(r"and then `make test-vllm`", sentence), sentence


def dead_readme_links(readme: Path, root: Path = ROOT) -> list[str]:
    """The README's relative link targets (`[text](docs/x.md#anchor)`, images too) that name no file
    of the repository; the site's build checks the pages' links, not the README's."""
    dead = []
    for number, line in enumerate(readme.read_text().splitlines(), 1):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"[a-z]+:|#", target):
                continue
            if not (root / target.split("#")[0]).exists():
                dead.append(f"{readme.name}:{number}: {target}")
    return dead


def test_every_readme_link_names_a_file():
    assert dead_readme_links(ROOT / "README.md") == []


def test_dead_readme_link_check_finds_what_it_should(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("")
    readme = tmp_path / "README.md"
    readme.write_text(
        "[a](docs/a.md#x), [web](https://example.org), [here](#top), ![f](docs/gone.png)\n"
        "[log](docs/measurement-log.md)\n"
    )
    assert dead_readme_links(readme, root=tmp_path) == [
        "README.md:1: docs/gone.png",
        "README.md:2: docs/measurement-log.md",
    ]


def test_figures_live_under_docs_images():
    """Every figure of the site is under docs/images/ (mkdocs.yml leaves that folder out of the nav
    check); none sits beside the pages."""
    images = DOCS / "images"
    assert sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.png") if p.parent != images) == []
    assert any(images.glob("*.png"))
