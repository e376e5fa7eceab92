"""How a stage's configuration flows, read from the source (nothing is imported): the whole config
of a stage (PPO, SFT, reward model, inference) is unpacked by the stage's entry alone, and every
function below it takes the parts it reads; ``mc`` names Monte-Carlo values, never the models'
config."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "marlhf"

# the whole configs of the stages and of the inference program
WHOLE_CONFIGS = {
    "PPOStageConfig",
    "SFTConfig",
    "RewardStageConfig",
    "SupervisedConfig",  # the SFT and reward-model stages' shared base
    "InferenceArgs",
}
# the functions that take a whole config: the entries that unpack it (module, function)
ENTRIES = {
    ("marlhf/stages/ppo/loop.py", "train"),
    ("marlhf/stages/ppo/loop.py", "setup"),
    ("marlhf/stages/sft/train.py", "train"),
    ("marlhf/stages/reward/train.py", "train"),
    ("marlhf/stages/reward/train.py", "_setup"),
    ("marlhf/stages/common.py", "setup_supervised"),  # the supervised stages' shared set-up
    ("marlhf/stages/common.py", "run_stage"),  # a stage's main: train(cfg), errors reported
    ("marlhf/stages/common.py", "_run_and_exit"),
    ("marlhf/inference/run.py", "run_inference"),
}
# an unannotated parameter of these names is a whole config in the stages' and inference's code
CONFIG_NAMES = {"cfg", "config", "args", "stage_cfg"}
NAMED_SCOPES = ("marlhf/stages/", "marlhf/inference/")
# the models' configs: never called `mc`
MODEL_CONFIGS = {"ActorCriticConfig", "TrainedModelConfig", "ModelConfig"}


def _names(annotation: ast.expr | None) -> set[str]:
    """The names an annotation mentions (``X``, ``m.X``, ``X | None``, ``"X"``)."""
    if annotation is None:
        return set()
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return set()
    out = set()
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
    return out


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = fn.args
    extra = [x for x in (a.vararg, a.kwarg) if x is not None]
    return [*a.posonlyargs, *a.args, *a.kwonlyargs, *extra]


def whole_config_takers(path: Path, source: str) -> list[str]:
    """``file:line function(parameter)`` for each function of ``source`` that takes a whole
    config: annotated with one of :data:`WHOLE_CONFIGS`, or unannotated and named as one (in the
    stages' and inference's modules), other than the :data:`ENTRIES`."""
    rel = path.relative_to(ROOT).as_posix() if path.is_absolute() else path.as_posix()
    named_scope = rel.startswith(NAMED_SCOPES)
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if (rel, node.name) in ENTRIES:
            continue
        for arg in _params(node):
            whole = _names(arg.annotation) & WHOLE_CONFIGS
            unannotated = arg.annotation is None and named_scope and arg.arg in CONFIG_NAMES
            if whole or unannotated:
                out.append(f"{rel}:{node.lineno} {node.name}({arg.arg})")
    return out


def models_config_called_mc(path: Path, source: str) -> list[str]:
    """``file:line`` of each parameter or local named ``mc`` that holds a models' config: annotated
    with one of :data:`MODEL_CONFIGS`, or assigned a config's ``.models`` part."""
    rel = path.relative_to(ROOT).as_posix() if path.is_absolute() else path.as_posix()
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for arg in _params(node):
                if arg.arg == "mc" and _names(arg.annotation) & MODEL_CONFIGS:
                    out.append(f"{rel}:{node.lineno} {node.name}(mc)")
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id == "mc" and _names(node.annotation) & MODEL_CONFIGS:
                out.append(f"{rel}:{node.lineno} mc: ...")
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = [(target, node.value)]
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts, strict=False))
                for t, v in pairs:
                    if (
                        isinstance(t, ast.Name)
                        and t.id == "mc"
                        and isinstance(v, ast.Attribute)
                        and v.attr == "models"
                    ):
                        out.append(f"{rel}:{node.lineno} mc = ....models")
    return out


def _scan(check) -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        out += check(path, path.read_text(encoding="utf-8"))
    return out


def test_only_the_stage_entries_take_a_whole_config():
    offenders = _scan(whole_config_takers)
    assert not offenders, "functions below a stage's entry take its whole config:\n" + "\n".join(
        offenders
    )


def test_the_entries_named_exist():
    """Each allowed entry is a function of its module (a renamed entry does not leave a hole)."""
    for rel, name in ENTRIES:
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert name in names, f"{rel} has no function {name}"


def test_mc_never_names_the_models_config():
    offenders = _scan(models_config_called_mc)
    assert not offenders, "`mc` names a models' config:\n" + "\n".join(offenders)


def test_the_checks_see_what_they_forbid():
    """Each check finds a hand-written offender and passes its fixed form."""
    stage = Path("marlhf/stages/ppo/example.py")
    bad = (
        "def score(models, cfg: PPOStageConfig): ...\n"
        "def plan(n, cfg: 'RewardStageConfig | None' = None): ...\n"
        "def walk(cfg): ...\n"
        "def train(cfg: PPOStageConfig): ...\n"  # not an entry in this module
    )
    assert len(whole_config_takers(stage, bad)) == 4
    good = "def score(models, ppo: PPOConfig, g: GenerationConfig): ...\n"
    assert whole_config_takers(stage, good) == []
    # an unannotated `cfg` outside the stages and inference is some other config
    assert whole_config_takers(Path("marlhf/gpu_check/x.py"), "def run(cfg): ...\n") == []
    # the entries themselves may take it
    entry = "def setup(cfg: PPOStageConfig): ...\n"
    assert whole_config_takers(Path("marlhf/stages/ppo/loop.py"), entry) == []

    bad_mc = (
        "def build(mc: ActorCriticConfig): ...\n"
        "def f(cfg):\n    mc, ppo = cfg.models, cfg.ppo\n"
        "def g(cfg):\n    mc = cfg.models\n"
        "def h():\n    mc: ModelConfig = x\n"
    )
    assert len(models_config_called_mc(stage, bad_mc)) == 4
    good_mc = (
        "def build(models: ActorCriticConfig): ...\n"
        "def f(cfg):\n    mc = MCValues(b, v)\n    models, ppo = cfg.models, cfg.ppo\n"
    )
    assert models_config_called_mc(stage, good_mc) == []
