"""marlhf.plugins: a user's file or module imported once, its errors one line naming the plugin."""

import doctest
import sys

import pytest

import marlhf.plugins as plugins
from marlhf.plugins import load_plugins, plugin_module_name


def test_doctests():
    assert doctest.testmod(plugins).failed == 0


@pytest.fixture
def clean_modules():
    """The plugin modules a test imports leave sys.modules afterwards."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_a_file_is_imported_once_under_its_own_name(tmp_path, clean_modules):
    path = tmp_path / "counting.py"
    path.write_text(
        "import builtins\nbuiltins.PLUGIN_RUNS = getattr(builtins, 'PLUGIN_RUNS', 0) + 1\n"
    )
    import builtins

    builtins.PLUGIN_RUNS = 0
    try:
        (first,) = load_plugins([str(path)])
        (again,) = load_plugins([f" {path} "])
        assert first is again and builtins.PLUGIN_RUNS == 1
        assert first.__name__ == plugin_module_name(path) and sys.modules[first.__name__] is first
        # a file of the same name elsewhere is another module
        other = tmp_path / "sub" / "counting.py"
        other.parent.mkdir()
        other.write_text(path.read_text())
        (second,) = load_plugins([str(other)])
        assert second is not first and builtins.PLUGIN_RUNS == 2
    finally:
        del builtins.PLUGIN_RUNS


def test_a_module_on_the_path_is_imported_by_name(tmp_path, monkeypatch, clean_modules):
    (tmp_path / "my_rules_pkg").mkdir()
    (tmp_path / "my_rules_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_rules_pkg" / "extra.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (module,) = load_plugins(["my_rules_pkg.extra", ""])  # empty entries are skipped
    assert module.VALUE == 7


def test_errors_name_the_plugin_and_the_line(tmp_path, clean_modules):
    with pytest.raises(ValueError, match=r"^--plugin nowhere/x\.py: no such file$"):
        load_plugins(["nowhere/x.py"])
    with pytest.raises(ValueError, match=r"^--plugin no_such_module_xyz: no module"):
        load_plugins(["no_such_module_xyz"])
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\nraise RuntimeError('broken on purpose')\n")
    with pytest.raises(ValueError) as info:
        load_plugins([str(bad)])
    assert str(info.value) == (
        f"--plugin {bad}: RuntimeError: broken on purpose ({bad.resolve()}:2)"
    )
    assert plugin_module_name(bad) not in sys.modules  # a failed import leaves nothing behind
    missing = tmp_path / "needs.py"
    missing.write_text("import no_such_dependency_xyz\n")
    with pytest.raises(ValueError, match="ModuleNotFoundError: No module named 'no_such_depen"):
        load_plugins([str(missing)])
