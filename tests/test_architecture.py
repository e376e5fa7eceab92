"""The package's shape, read from its source (nothing is imported): no import circles between
modules or between packages, imports inside functions only for heavy or optional dependencies, and
a product that speaks of what it does (no tracker numbers, no history)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "marlhf"

# Third-party modules a function may import (the first component, or a dotted prefix): optional
# extras that are not installed everywhere, and packages that cost seconds to import, which the
# light paths (the pure math, the data tools, the judge, the CLIs' --help) never need.
DEFERRED = {
    # optional extras
    "spacy": "parsing backend (pip install spacy)",
    "benepar": "parsing backend (pip install benepar)",
    "openai": "LLM judge client (the eval extra)",
    "vllm": "generation backend",
    "trl": "baseline in benchmarks",
    "wandb": "tracker",
    "trackio": "tracker",
    "yaml": "config files in YAML (pip install pyyaml)",
    "skyrl_gym": "environments of multi-turn agents (the agents extra; imports pandas)",
    "omegaconf": "an environment's env_config (a dependency of skyrl-gym)",
    "seccomp": "libseccomp's bindings (Debian python3-seccomp)",
    "pyseccomp": "libseccomp's bindings (pip)",
    "math_verify": "verifiable math rewards (pip install math-verify)",
    "reasoning_gym": "reasoning-gym tasks and their scorers (pip install reasoning-gym)",
    "termios": "POSIX terminal (the human evaluation's key reader)",
    "tty": "POSIX terminal (the human evaluation's key reader)",
    # heavy: seconds each on a CPU
    "deepspeed": "engines, ZeRO gathers, the launcher's process group",
    "transformers": "models and tokenizers",
    "tokenizers": "training the tiny model's tokenizer",
    "peft": "LoRA",
    "safetensors": "weight files",
    "datasets": "hub and local dataset files",
    "pyarrow": "parquet schemas (a dependency of datasets)",
    "matplotlib": "figures",
    "torch.utils.tensorboard": "TensorBoard scalars",
    "torch.profiler": "profiles",
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(tree: ast.AST):
    """(module imported, line, inside a function) of every import in ``tree``; ``from X import
    Y`` counts as an import of ``X.Y`` when that is a module of the package."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, inside) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                for a in child.names:
                    sub = f"{child.module}.{a.name}"
                    found.append((sub if sub in MODULES else child.module, child.lineno, inside))
            visit(child, inside)

    visit(tree, False)
    return found


def _graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (anywhere in the file, TYPE_CHECKING included)."""
    graph = {}
    for name, path in MODULES.items():
        targets = set()
        for mod, _, _ in _imports(ast.parse(path.read_text())):
            while mod and mod not in MODULES:
                mod = mod.rpartition(".")[0]
            if mod.startswith("marlhf.") and mod != name:
                targets.add(mod)
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _package_of(module: str) -> str:
    """The subpackage (``marlhf.algo``) or top-level module (``marlhf.cli``) a module is in."""
    return ".".join(module.split(".")[:2])


def test_no_import_circles_between_modules():
    assert _cycles(_graph()) == []


def test_no_import_circles_between_packages():
    packages: dict[str, set[str]] = {}
    for mod, targets in _graph().items():
        src = _package_of(mod)
        packages.setdefault(src, set()).update(
            _package_of(t) for t in targets if _package_of(t) != src
        )
    assert _cycles(packages) == []


# The packages from the ground up (docs/CONVENTIONS.md, "Layout"): each imports only packages before it.
LAYERS = (
    "marlhf.config",
    "marlhf.config_file",
    "marlhf.plugins",
    "marlhf.cli",
    "marlhf.stats",
    "marlhf.runtime",
    "marlhf.macro",
    "marlhf.algo",
    "marlhf.rewards",
    "marlhf.data",
    "marlhf.models",
    "marlhf.envs",
    "marlhf.stages",
    "marlhf.inference",
    "marlhf.judge",
    "marlhf.pipeline",
    "marlhf.gpu_check",
)


def test_packages_import_only_the_packages_below_them():
    upward = []
    for mod, targets in _graph().items():
        src = _package_of(mod)
        if src not in LAYERS:  # the package root and the forwarding entry points
            continue
        for t in targets:
            dst = _package_of(t)
            if dst in LAYERS and LAYERS.index(dst) > LAYERS.index(src):
                upward.append(f"{mod} -> {t}")
    assert upward == []
    # every module is in a layer, or is an entry point forwarding to one
    loose = {_package_of(m) for m in MODULES} - set(LAYERS) - {"marlhf"}
    assert loose == {
        "marlhf.demo", "marlhf.preflight", "marlhf.tiny", "marlhf.compare", "marlhf.view",
        "marlhf.__main__", "marlhf.commands",  # the `marlhf` command over every program
    }  # fmt: skip


def test_cycle_finder_sees_a_circle():
    """The check above can fail: a three-module loop and a self-contained tail."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def _deferred(module: str) -> bool:
    return any(module == d or module.startswith(d + ".") for d in DEFERRED)


def test_imports_inside_functions_are_only_heavy_or_optional_dependencies():
    found = []
    for path in MODULES.values():
        for mod, line, inside in _imports(ast.parse(path.read_text())):
            if inside and not _deferred(mod):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    assert found == []


def _annotation_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside annotations (not evaluated: every module has ``from __future__
    import annotations``)."""
    out: set[int] = set()
    for n in ast.walk(tree):
        parts = [getattr(n, "annotation", None), getattr(n, "returns", None)]
        for a in parts:
            if a is not None:
                out |= {id(x) for x in ast.walk(a)}
    return out


def _type_checking_only(tree: ast.Module) -> set[str]:
    """Names imported under ``if TYPE_CHECKING:`` and bound nowhere else in the module."""
    only, real = set(), set()
    for node in tree.body:
        guarded = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node):
            if isinstance(n, ast.Import | ast.ImportFrom):
                names = {a.asname or a.name.split(".")[0] for a in n.names}
                (only if guarded else real).update(names)
            elif not guarded and isinstance(n, ast.FunctionDef | ast.ClassDef):
                real.add(n.name)
            elif not guarded and isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                real.add(n.id)
    return only - real


def test_names_imported_for_type_checking_are_only_used_in_annotations():
    """A name imported under TYPE_CHECKING does not exist when the code runs."""
    found = []
    for path in MODULES.values():
        tree = ast.parse(path.read_text())
        only, annotations = _type_checking_only(tree), _annotation_nodes(tree)
        for n in ast.walk(tree):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in only:
                if id(n) not in annotations:
                    found.append(f"{path.relative_to(ROOT)}:{n.lineno} uses {n.id}")
    assert found == []


def test_type_checking_check_sees_a_runtime_use():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from m import EMA\n"
        "def f(x: EMA) -> EMA:\n    return EMA(x)\n"
    )
    only, annotations = _type_checking_only(tree), _annotation_nodes(tree)
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in only]
    assert only == {"EMA"} and sum(id(n) not in annotations for n in uses) == 1


HISTORY = re.compile(
    r"(?<![:\w])#\d+\b|\bissues? #?\d|\bsessions? \d|\bthis session\b|\btoday'?s?\b|\bas before\b",
    re.IGNORECASE,
)
# Other projects' trackers cited as references (verl's RFC #7244, TRL issue #6789) are sources, not
# history.
EXTERNAL_REFERENCE = re.compile(
    r"\b(?:RFC|(?:TRL|verl|vLLM|DeepSpeed|transformers|OpenRLHF|PyTorch)(?:'s)? (?:issue|PR)) #\d+",
    re.IGNORECASE,
)
# Outside marlhf/: the scripts, benchmarks and tests, Python and shell.
SCRIPT_DIRS = ("tests", "benchmarks", "scripts", "training", "inference", "evaluation")
# The self-tests of the patterns hold what the patterns forbid: their bodies are not scanned.
PATTERN_SELF_TEST = "history_pattern_matches_what_it_forbids"


def _pattern_self_test_lines(path: Path, text: str) -> set[int]:
    if path.suffix != ".py":
        return set()
    return {
        i
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef) and node.name.endswith(PATTERN_SELF_TEST)
        for i in range(node.lineno, node.end_lineno + 1)
    }


def history_lines(path: Path, pattern: re.Pattern = HISTORY) -> list[str]:
    """The lines of `path` that `pattern` finds once other projects' trackers are left out, as
    `path:line: text`; the bodies of the patterns' self-tests are skipped."""
    text = path.read_text()
    skip = _pattern_self_test_lines(path, text)
    return [
        f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{i}: {line.strip()}"
        for i, line in enumerate(text.splitlines(), 1)
        if i not in skip and pattern.search(EXTERNAL_REFERENCE.sub("", line))
    ]


def script_files(root: Path = ROOT) -> list[Path]:
    return sorted(
        p for d in SCRIPT_DIRS for ext in ("py", "sh") for p in (root / d).rglob(f"*.{ext}")
    )


def test_the_library_speaks_of_what_it_does_not_of_its_history():
    """No line of marlhf/ (code, docstrings, comments, help texts) matches HISTORY: the product
    describes what it does, not the tracker items or work sessions that made it."""
    assert [line for path in MODULES.values() for line in history_lines(path)] == []


def test_scripts_benchmarks_and_tests_speak_of_what_they_do_not_of_their_history():
    """The same for every Python and shell file of tests/, benchmarks/, scripts/, training/,
    inference/ and evaluation/: test names, docstrings, comments and printed labels."""
    files = script_files()
    names = {p.relative_to(ROOT).as_posix() for p in files}
    assert {
        "tests/test_architecture.py",
        "benchmarks/horizon_sweep.py",
        "scripts/make_synthetic_data.py",
        "inference/inference_with_rewards.py",
        "evaluation/gpt4-eval.py",
        "training/step3_rlhf_finetuning/training_scripts/run_tiny.sh",
    } <= names
    assert [line for path in files for line in history_lines(path)] == []


def test_history_pattern_matches_what_it_forbids():
    for text in ("(issue #12 §1)", "today's trainer", "exactly as before", "session 4"):
        assert HISTORY.search(text), text
    for text in ("the tissue", "a new session (setsid)", "color:#555", "x = d['#']"):
        assert not HISTORY.search(text), text


def test_scan_for_history_pattern_matches_what_it_forbids(tmp_path):
    """The scan for HISTORY reads the Python and shell files of every scripts directory, leaves
    other projects' trackers alone and skips only the body of a pattern self-test."""
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "training").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "benchmarks" / "b.py").write_text('print("sweep of session 3")\n')
    (tmp_path / "training" / "run.sh").write_text("# recipe as before\necho ok\n")
    (tmp_path / "training" / "notes.txt").write_text("issue #12\n")
    (tmp_path / "tests" / "test_x.py").write_text(
        f"def test_{PATTERN_SELF_TEST}():\n"
        '    assert "issue #12"\n'
        "\n"
        "def test_y():\n"
        '    """issue 13, item 3; verl RFC #7244."""\n'
    )
    files = script_files(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in files] == [
        "benchmarks/b.py",
        "tests/test_x.py",
        "training/run.sh",
    ]
    found = [line.split(": ", 1)[0] for path in files for line in history_lines(path)]
    assert found == [
        f"{tmp_path}/benchmarks/b.py:1",
        f"{tmp_path}/tests/test_x.py:5",
        f"{tmp_path}/training/run.sh:1",
    ]
    assert history_lines(tmp_path / "tests" / "test_x.py", re.compile("RFC")) == []
