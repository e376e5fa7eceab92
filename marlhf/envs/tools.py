"""skyrl-gym's Python tool run through this project's sandbox.

skyrl-gym's ``PythonCodeExecutorToolGroup`` runs model-written code with ``python -c`` in a plain
subprocess: it sees the trainer's environment variables, files and network. Every environment built
here (:func:`marlhf.envs.loading.build_env`) has each such tool group (in ``env.tool_groups`` or as
an attribute of the environment) replaced by :class:`SandboxedPythonTool`, which keeps the group's
name, tool name and timeout and the texts the environment parses, and runs the code with
:func:`marlhf.rewards.sandbox.run.run_python`: a fresh isolated interpreter without site-packages
(the standard library only), no network, writes confined to a temporary directory, limits on memory,
CPU and output (the sandbox's docstring lists its layers).
"""

from __future__ import annotations

from typing import Any

from marlhf.rewards.sandbox.run import run_python

TOOL_GROUP = "PythonCodeExecutorToolGroup"
# the sandbox's address-space limit of one tool call, MiB
TOOL_MEMORY_MB = 1024


class SandboxedPythonTool:
    """Stands in for ``skyrl_gym.tools.PythonCodeExecutorToolGroup`` (same name, tool ``python``,
    ``timeout``, and the same answers: the standard output stripped, or ``Error executing Python
    code: ...``), executing through the sandbox."""

    def __init__(self, timeout: float = 10.0, name: str = TOOL_GROUP):
        self.timeout = float(timeout)
        self.name = name

    def get_name(self) -> str:
        return self.name

    def python(self, code: str) -> str:
        result = run_python(code, timeout_s=self.timeout, memory_mb=TOOL_MEMORY_MB)
        if result.status == "timeout":
            return f"Error executing Python code: Execution timed out after {self.timeout} seconds."
        if result.stderr:
            return f"Error executing Python code: {result.stderr.strip()}"
        return result.stdout.strip() if result.stdout else ""

    def get_tool(self, name: str):
        return self.python if name == "python" else None

    def get_tool_names(self) -> list[str]:
        return ["python"]

    def execute_tool(self, name: str, *args, **kwargs) -> Any:
        if name != "python":
            raise ValueError(f"Tool '{name}' not found in group '{self.name}'.")
        return self.python(*args, **kwargs)

    def get_tool_to_group_mapping(self) -> dict[str, str]:
        return {"python": self.name}


def _is_python_tool(obj: Any) -> bool:
    from skyrl_gym.tools.python import PythonCodeExecutorToolGroup

    return isinstance(obj, PythonCodeExecutorToolGroup)


def sandbox_python_tools(env: Any) -> int:
    """Replace every skyrl-gym Python tool group of ``env`` (in ``env.tool_groups`` and in its
    attributes, alone or in a list) by a :class:`SandboxedPythonTool`; how many were replaced."""
    replaced = 0
    for key, value in list(vars(env).items()):
        if _is_python_tool(value):
            setattr(env, key, SandboxedPythonTool(value.timeout, value.name))
            replaced += 1
        elif isinstance(value, list) and any(_is_python_tool(v) for v in value):
            new = [
                SandboxedPythonTool(v.timeout, v.name) if _is_python_tool(v) else v for v in value
            ]
            replaced += sum(_is_python_tool(v) for v in value)
            value[:] = new  # in place: other references to the list see the sandboxed tool too
    return replaced
