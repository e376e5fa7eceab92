"""The shape of the RL code: pure math without DeepSpeed, short functions, a loop that fits a screen."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALGO = ROOT / "marlhf" / "algo"
PPO = ROOT / "marlhf" / "stages" / "ppo"
PURE = ("gae", "losses", "kl_rewards")


def _imports(tree: ast.AST) -> set[str]:
    """Top-level package of every import statement anywhere in ``tree``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _own_imports(tree: ast.AST) -> set[str]:
    return {
        n.module
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("marlhf")
    }


def test_pure_modules_import_only_torch_and_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"torch", "__future__"}
    # the names the flags choose among (marlhf.algo.names) are plain data: the standard library only
    names = ast.parse((ALGO / "names.py").read_text())
    assert _imports(names) <= set(sys.stdlib_module_names) | {"__future__"}
    for name in PURE:
        tree = ast.parse((ALGO / f"{name}.py").read_text())
        assert _own_imports(tree) <= {"marlhf.algo.names"}, name
        used = _imports(tree) - ({"marlhf"} if _own_imports(tree) else set())
        assert used <= allowed, (name, used - allowed)
    # the packing helpers of the rollout too, and the log-probabilities they read: torch only
    models = ROOT / "marlhf" / "models"
    assert _imports(ast.parse((models / "logprobs.py").read_text())) <= allowed
    tree = ast.parse((models / "sequences.py").read_text())
    own = {
        n.module
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("marlhf")
    }
    assert own == {"marlhf.models.logprobs"}, own
    assert _imports(tree) <= allowed | {"marlhf"}


def test_importing_the_package_does_not_import_deepspeed():
    modules = [
        f"marlhf.{pkg}.{p.stem}"
        for pkg, path in (("algo", ALGO), ("stages.ppo", PPO))
        for p in sorted(path.glob("*.py"))
        if not p.stem.startswith("__")  # __main__ runs the stage
    ]
    modules += [
        "marlhf.runtime.length_groups",
        "marlhf.runtime.resources",
        "marlhf.models.response_logits",
    ]
    assert {f"marlhf.algo.{n}" for n in PURE} <= set(modules)
    code = (
        "import sys, importlib\n"
        "import marlhf.stages.ppo\n"
        "assert 'deepspeed' not in sys.modules, 'marlhf.stages.ppo'\n"
        f"for name in {modules + ['marlhf.stages.ppo']!r}:\n"
        "    importlib.import_module(name)\n"
        "    assert 'deepspeed' not in sys.modules, name\n"
        "print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


# what the parsing rule's backends bring: its modules, the parsers, the process pool of
# --parse_workers (torch itself imports multiprocessing, so only what it does not import counts)
PARSING = (
    "marlhf.macro.parsing",
    "spacy",
    "benepar",
    "multiprocessing",
    "concurrent.futures.process",
)


def test_importing_the_estimators_loads_no_parser_and_no_process_pool():
    """``marlhf.algo`` imports nothing heavy; ``marlhf.algo.estimators`` imports the rules'
    registry but not the parsing rule's modules, a parser or a process pool, beyond what torch
    imports itself (the parsing rule loads them when it is built)."""
    code = (
        "import sys\n"
        "def heavy(names):\n"
        f"    return sorted(n for n in names if n.startswith({PARSING!r}))\n"
        "import marlhf.algo\n"
        "print(heavy(sys.modules), 'torch' in sys.modules)\n"
        "import torch\n"
        "base = set(sys.modules)\n"
        "import marlhf.algo.estimators\n"
        "print(heavy(set(sys.modules) - base), 'marlhf.macro.rules' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["[] False", "[] True"]


def _functions(path: Path) -> dict[str, int]:
    tree = ast.parse(path.read_text())
    return {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def test_no_function_in_the_package_is_longer_than_100_lines():
    """No function anywhere in ``marlhf/`` (nested ones included) over 100 lines."""
    long = []
    for path in sorted((ROOT / "marlhf").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > 100:
                    long.append(f"{path.relative_to(ROOT)}::{node.name} ({n} lines)")
    assert not long, long


def test_the_training_loop_fits_in_150_lines():
    """train() and the step it repeats read as the algorithm, on a screen or two."""
    lengths = _functions(PPO / "loop.py")
    assert lengths["train"] + lengths["ppo_step"] <= 150, lengths
