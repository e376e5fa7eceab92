"""The installed package carries every bundled file (the task data and every shipped model), so a
non-editable ``pip install .`` can run the demo and the long-horizon tasks as the checkout does."""

import ast
import fnmatch
import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _matches(path: str, glob: str) -> bool:
    """setuptools' package-data glob: ``*`` stays within one path component."""
    parts, pats = path.split("/"), glob.split("/")
    return len(parts) == len(pats) and all(map(fnmatch.fnmatchcase, parts, pats))


def test_glob_semantics():
    assert _matches("data/bundled/x.jsonl", "data/bundled/*")
    assert not _matches("data/bundled/tiny_base/config.json", "data/bundled/*")


def test_package_data_covers_every_bundled_file():
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["marlhf"]
    package = ROOT / "marlhf"
    files = [p for p in (package / "data" / "bundled").rglob("*") if p.is_file()]
    assert any(p.parent.name == "tiny_rm_base" for p in files)  # the walk sees the models
    missing = [
        str(p.relative_to(package))
        for p in files
        if not any(_matches(p.relative_to(package).as_posix(), g) for g in globs)
        and p.name != ".gitignore"
    ]
    assert not missing, f"pyproject.toml package-data misses {missing}"


# how a distribution is imported, where its name is not its module's
_IMPORTED_AS = {"tensorboard": "torch.utils.tensorboard"}


def test_every_dependency_is_imported_by_the_package():
    """A dependency earns its place: each one pyproject.toml requires is imported somewhere in
    marlhf/ (accelerate, which only peft needs, is peft's to require)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~ \[]", d, maxsplit=1)[0].lower() for d in deps}
    imported = set()
    for path in (ROOT / "marlhf").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module)
    unused = [
        n
        for n in sorted(names)
        if not any(
            m == _IMPORTED_AS.get(n, n) or m.startswith(_IMPORTED_AS.get(n, n) + ".")
            for m in imported
        )
    ]
    assert unused == []


def test_every_directory_of_modules_is_a_package():
    """Every directory of modules is a regular package (an __init__.py): a namespace package would
    merge with any same-named directory on sys.path."""
    package = ROOT / "marlhf"
    dirs = {p.parent for p in package.rglob("*.py")}
    missing = sorted(str(d.relative_to(ROOT)) for d in dirs if not (d / "__init__.py").is_file())
    assert missing == []
