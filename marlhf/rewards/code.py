"""Execution-based reward for program synthesis (APPS) and the pass@k estimator.

A generated program is run in :mod:`marlhf.rewards.sandbox.run` against a problem's test cases; the reward is
the fraction of tests passed, or the PPOCoder/CodeRL-style scheme with penalties for compile and
run-time errors (:func:`code_reward`). :class:`CodeRewarder` scores a batch concurrently with a
per-program time budget, so the trainer never waits on a hostile or looping program.

APPS test format (``codeparrot/apps``, column ``input_output``, a JSON string)
-----------------------------------------------------------------------------
``{"inputs": [...], "outputs": [...]}`` for standard-input programs: each input is fed to stdin,
each output is the expected stdout. With ``"fn_name"`` the problem is *call-based*: each input is
the argument list, each output the return value; the program defines either a plain function
``fn_name`` or a LeetCode-style ``class Solution`` with that method (tried first).

Comparison rules
----------------
* **stdin/stdout**: an input or output given as a list of lines is joined with ``"\\n"``. The
  program's stdout and the expected text are split on whitespace (so trailing newlines, trailing
  spaces, ``\\r\\n`` and spacing between tokens do not matter, as with token-based contest
  checkers); they match when the token lists are equal, or have the same length and every
  differing pair parses as floats equal within ``1e-6`` (absolute or relative).
* **call-based**: the return value goes through JSON (tuples become lists, as APPS' own harness
  converts them) and is compared with the expected value recursively, floats within ``1e-6``; since
  APPS often wraps the expected value in a one-element list, a value equal to ``expected[0]`` of a
  one-element list also passes.

Example:
    >>> suite = parse_tests('{"inputs": ["1 2\\\\n"], "outputs": ["3\\\\n"]}')
    >>> res = run_tests("a, b = map(int, input().split())\\nprint(a + b)", suite, timeout_s=5.0)
    >>> (res.passed, res.total, code_reward(res))
    (1, 1, 1.0)
    >>> round(pass_at_k(n=10, c=3, k=1), 3)
    0.3
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from marlhf.config import check_own_numbers, flag
from marlhf.rewards.sandbox.run import clean_stale_workdirs, run_python, sandbox_layers

log = logging.getLogger(__name__)

# PPOCoder / CodeRL reward values (Le et al. 2022, CodeRL §3.1; Shojaee et al. 2023, PPOCoder eq. 3).
COMPILE_ERROR_PENALTY = -1.0
RUNTIME_ERROR_PENALTY = -0.6
WRONG_ANSWER_PENALTY = -0.3  # "coderl" only
SCHEMES = ("pass_fraction", "ppocoder", "coderl")

# Per-test statuses: "pass", "wrong_answer", the sandbox failures, and "skipped" (not run: the
# program's time budget was spent or an earlier test failed with stop_on_first_failure).
RUNTIME_FAILURES = frozenset({"runtime_error", "memory", "output_limit", "blocked"})

_SENTINEL = "\x1e__marlhf_result__\x1e"
_FLOAT_TOL = 1e-6
# Python refuses int <-> decimal-string conversions beyond 4300 digits (sys.int_info), but APPS tests
# hold integers of 9000+ digits; longer literals go through Decimal, which has no such limit.
_INT_DIGITS_SAFE = 4000


def _parse_int(text: str) -> int:
    return int(text) if len(text) <= _INT_DIGITS_SAFE else int(Decimal(text))


def _int_text(n: int) -> str:
    return str(n) if -(10**_INT_DIGITS_SAFE) < n < 10**_INT_DIGITS_SAFE else format(Decimal(n), "f")


def parse_json(text: str) -> Any:
    """``json.loads`` that also reads integer literals longer than Python's int-string limit."""
    return json.loads(text, parse_int=_parse_int)


def _dumps(obj: Any) -> str:
    """``json.dumps`` that also writes integers longer than Python's int-string limit."""
    if isinstance(obj, int) and not isinstance(obj, bool):
        return _int_text(obj)
    if isinstance(obj, (list, tuple)):
        return "[" + ", ".join(_dumps(x) for x in obj) + "]"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_dumps(v)}" for k, v in obj.items()) + "}"
    return json.dumps(obj)


@dataclass(frozen=True)
class TestSuite:
    """Test cases of one problem. ``fn_name`` is None for stdin/stdout problems."""

    __test__ = False  # not a pytest class

    inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]
    fn_name: str | None = None

    def __len__(self) -> int:
        return len(self.inputs)


@dataclass(frozen=True)
class CodeResult:
    """Outcome of running one program on a suite; ``statuses[i]`` is the status of test ``i``."""

    passed: int
    total: int
    statuses: tuple[str, ...]
    compile_error: bool
    runtime_error: bool
    timeout: bool


def parse_tests(input_output: str | dict) -> TestSuite:
    """Parse an APPS ``input_output`` field (JSON text or an already-decoded dict)."""
    if isinstance(input_output, str):
        try:
            data = parse_json(input_output)
        except json.JSONDecodeError as e:
            raise ValueError(f"input_output: not valid JSON ({e})") from e
    else:
        data = input_output
    if not isinstance(data, dict):
        raise ValueError(f"input_output: expected a JSON object, got {type(data).__name__}")
    for key in ("inputs", "outputs"):
        if key not in data:
            raise ValueError(f'input_output: field "{key}" missing')
        if not isinstance(data[key], list):
            raise ValueError(f'input_output: field "{key}" must be a list')
    if len(data["inputs"]) != len(data["outputs"]):
        raise ValueError(
            f"input_output: {len(data['inputs'])} inputs but {len(data['outputs'])} outputs"
        )
    fn_name = data.get("fn_name")
    if fn_name is not None and (not isinstance(fn_name, str) or not fn_name.isidentifier()):
        raise ValueError(f'input_output: field "fn_name" must be an identifier, got {fn_name!r}')
    return TestSuite(tuple(data["inputs"]), tuple(data["outputs"]), fn_name)


def _str(x: Any) -> str:
    return _int_text(x) if isinstance(x, int) and not isinstance(x, bool) else str(x)


def _as_text(x: Any) -> str:
    if isinstance(x, list):
        return "\n".join(_str(line) for line in x)
    return _str(x)


def _floats_close(a: str | float, b: str | float) -> bool:
    try:
        fa, fb = float(a), float(b)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond float range
        return False
    if math.isnan(fa) or math.isnan(fb):
        return False
    return math.isclose(fa, fb, rel_tol=_FLOAT_TOL, abs_tol=_FLOAT_TOL)


def stdout_matches(got: str, expected: Any) -> bool:
    """Token-wise comparison of a program's stdout with the expected output (module docstring)."""
    a, b = got.split(), _as_text(expected).split()
    if a == b:
        return True
    return len(a) == len(b) and all(
        x == y or _floats_close(x, y) for x, y in zip(a, b, strict=True)
    )


def _values_equal(got: Any, expected: Any) -> bool:
    if isinstance(got, bool) or isinstance(expected, bool):
        return got == expected and type(got) is type(expected)
    if isinstance(got, (int, float)) and isinstance(expected, (int, float)):
        return got == expected or _floats_close(got, expected)
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(map(_values_equal, got, expected))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(
            _values_equal(got[k], expected[k]) for k in got
        )
    return got == expected


def return_matches(got: Any, expected: Any) -> bool:
    """Call-based comparison (module docstring): ``got`` is already JSON-normalised."""
    if _values_equal(got, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and _values_equal(got, expected[0])


def _call_harness(fn_name: str) -> str:
    """Code appended to a call-based program: read the JSON argument list from stdin, call the
    method of ``Solution`` (or the plain function), print the JSON result after a sentinel."""
    return (
        "\n\ndef __marlhf_call():\n"
        "    import json as _j, sys as _s\n"
        "    _args = _j.loads(_s.stdin.read())\n"
        "    _cls = globals().get('Solution')\n"
        f"    if isinstance(_cls, type) and hasattr(_cls, {fn_name!r}):\n"
        f"        _fn = getattr(_cls(), {fn_name!r})\n"
        "    else:\n"
        f"        _fn = globals()[{fn_name!r}]\n"
        "    _r = _fn(*_args) if isinstance(_args, list) else _fn(_args)\n"
        "    _s.stdout.flush()\n"
        f"    _s.stdout.write({_SENTINEL!r} + _j.dumps(_r, default=repr) + '\\n')\n"
        "__marlhf_call()\n"
    )


def _check_compiles(source: str) -> bool:
    try:
        compile(source, "solution.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError):
        return False
    return True


def run_tests(
    source: str,
    suite: TestSuite,
    *,
    timeout_s: float = 4.0,
    memory_mb: int = 512,
    max_tests: int | None = None,
    stop_on_first_failure: bool = False,
    budget_s: float | None = None,
) -> CodeResult:
    """Run ``source`` on each test of ``suite``, one sandboxed process per test.

    Args:
        timeout_s: wall-clock limit per test.
        memory_mb: address-space limit per test.
        max_tests: use only the first ``max_tests`` tests (``total`` counts only those).
        stop_on_first_failure: mark the tests after the first failure ``"skipped"``.
        budget_s: overall wall-clock budget for the program; each test's timeout is cut to what is
            left, and tests that cannot start are ``"skipped"`` and set ``timeout``.
    """
    n = len(suite) if max_tests is None else min(len(suite), max_tests)
    if n == 0:
        return CodeResult(0, 0, (), False, False, False)
    if not _check_compiles(source):
        return CodeResult(0, n, ("compile_error",) * n, True, False, False)
    program = source if suite.fn_name is None else source + _call_harness(suite.fn_name)
    deadline = None if budget_s is None else time.monotonic() + budget_s
    statuses: list[str] = []
    out_of_budget = False
    for i in range(n):
        left = timeout_s if deadline is None else min(timeout_s, deadline - time.monotonic())
        if left <= 0.05:  # not enough time left to even start an interpreter
            out_of_budget = True
            statuses.extend(["skipped"] * (n - i))
            break
        if suite.fn_name is None:
            stdin = _as_text(suite.inputs[i])
        else:
            stdin = _dumps(suite.inputs[i])
        r = run_python(program, stdin, timeout_s=left, memory_mb=memory_mb)
        if r.status != "ok":
            status = r.status
        elif suite.fn_name is None:
            status = "pass" if stdout_matches(r.stdout, suite.outputs[i]) else "wrong_answer"
        else:
            _, sep, payload = r.stdout.rpartition(_SENTINEL)
            try:
                got = parse_json(payload) if sep else None
                ok = bool(sep) and return_matches(got, suite.outputs[i])
            except json.JSONDecodeError:
                ok = False
            status = "pass" if ok else "wrong_answer"
        statuses.append(status)
        if stop_on_first_failure and status != "pass":
            statuses.extend(["skipped"] * (n - i - 1))
            break
    return CodeResult(
        passed=statuses.count("pass"),
        total=n,
        statuses=tuple(statuses),
        compile_error=False,
        runtime_error=any(s in RUNTIME_FAILURES for s in statuses),
        timeout=out_of_budget or "timeout" in statuses,
    )


def code_reward(result: CodeResult, scheme: str = "pass_fraction") -> float:
    """Scalar reward of one program.

    * ``pass_fraction``: ``passed / total`` (0 when there are no tests), in [0, 1].
    * ``ppocoder``: ``-1.0`` on a compile error; else ``-0.6`` if any test ended in a run-time
      failure (exception, memory, output limit, blocked operation) or a timeout; else
      ``passed / total``.
    * ``coderl``: CodeRL's discrete values: ``-1.0`` compile error, ``-0.6`` run-time failure or
      timeout, ``-0.3`` some test wrong, ``+1.0`` all tests pass.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"--code_reward_scheme must be one of {SCHEMES}, got {scheme!r}")
    frac = result.passed / result.total if result.total else 0.0
    if scheme == "pass_fraction":
        return frac
    if result.compile_error:
        return COMPILE_ERROR_PENALTY
    if result.runtime_error or result.timeout:
        return RUNTIME_ERROR_PENALTY
    if scheme == "ppocoder":
        return frac
    return 1.0 if result.total and result.passed == result.total else WRONG_ANSWER_PENALTY


def code_stats(results: Sequence[CodeResult], rewards: Sequence[float]) -> dict[str, float]:
    """Batch metrics of scored programs (fractions of the batch, in [0, 1], except ``code/reward``):
    ``code/pass_rate`` mean fraction of tests passed, ``code/all_pass`` programs passing every test,
    ``code/compile_error``, ``code/runtime_error`` (a run-time failure in some test), ``code/timeout``,
    and ``code/reward`` the mean reward. An empty batch gives ``{}``."""
    n = len(results)
    if n == 0:
        return {}
    if len(rewards) != n:
        raise ValueError(f"{n} results but {len(rewards)} rewards")
    return {
        "code/pass_rate": sum(r.passed / r.total if r.total else 0.0 for r in results) / n,
        "code/all_pass": sum(bool(r.total) and r.passed == r.total for r in results) / n,
        "code/compile_error": sum(r.compile_error for r in results) / n,
        "code/runtime_error": sum(r.runtime_error for r in results) / n,
        "code/timeout": sum(r.timeout for r in results) / n,
        "code/reward": sum(rewards) / n,
    }


@dataclass
class CodeRewardConfig:
    """Execution-based reward for code generation (APPS)."""

    code_reward_scheme: str = flag("pass_fraction", "Reward from test results.", choices=SCHEMES)
    code_workers: int = flag(
        2, "Programs executed concurrently (one process each).", range="[1, inf)"
    )
    code_timeout_s: float = flag(4.0, "Wall-clock limit per test (s).", range="(0, inf)")
    code_memory_mb: int = flag(512, "Address-space limit per test (MiB).", range="[32, inf)")
    code_budget_s: float = flag(
        30.0, "Overall wall-clock budget per program (s).", range="(0, inf)"
    )
    code_max_tests: int | None = flag(
        None, "Use at most this many tests per problem (default: all).", range="[1, inf)"
    )

    def __post_init__(self) -> None:
        check_own_numbers(self)
        if self.code_reward_scheme not in SCHEMES:
            raise ValueError(
                f"--code_reward_scheme must be one of {SCHEMES}, got {self.code_reward_scheme!r}"
            )


class CodeRewarder:
    """Score a batch of programs concurrently.

    A thread pool drives the sandboxed subprocesses (the work happens in the children, so threads
    suffice). Each program has an overall ``budget_s``, so a batch of ``B`` programs takes at most
    about ``ceil(B / workers) * budget_s`` plus interpreter start-up.
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        timeout_s: float = 4.0,
        memory_mb: int = 512,
        budget_s: float = 30.0,
        max_tests: int | None = None,
        stop_on_first_failure: bool = False,
        scheme: str = "pass_fraction",
    ) -> None:
        CodeRewardConfig(scheme, workers, timeout_s, memory_mb, budget_s, max_tests)  # validates
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.budget_s = budget_s
        self.max_tests = max_tests
        self.stop_on_first_failure = stop_on_first_failure
        self.scheme = scheme
        # at start: remove the work dirs of trainers that died, and say which layers hold
        clean_stale_workdirs()
        self.layers = sandbox_layers()
        log.info("code reward: programs run in the sandbox with %s", ", ".join(self.layers))
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="code-reward")

    @classmethod
    def from_config(cls, cfg: CodeRewardConfig) -> CodeRewarder:
        return cls(
            cfg.code_workers,
            timeout_s=cfg.code_timeout_s,
            memory_mb=cfg.code_memory_mb,
            budget_s=cfg.code_budget_s,
            max_tests=cfg.code_max_tests,
            scheme=cfg.code_reward_scheme,
        )

    def _one(self, source: str, suite: TestSuite) -> CodeResult:
        return run_tests(
            source,
            suite,
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
            max_tests=self.max_tests,
            stop_on_first_failure=self.stop_on_first_failure,
            budget_s=self.budget_s,
        )

    def score(self, programs: Sequence[str], suites: Sequence[TestSuite]) -> list[CodeResult]:
        """Run ``programs[b]`` on ``suites[b]`` for every b; results in input order."""
        if len(programs) != len(suites):
            raise ValueError(f"{len(programs)} programs but {len(suites)} test suites")
        return list(self._pool.map(self._one, programs, suites))

    def evaluate(
        self, responses: Sequence[str], suites: Sequence[TestSuite], *, extract: bool = True
    ) -> tuple[list[float], list[CodeResult]]:
        """Rewards (B,) and test results of model responses; code is taken with
        :func:`extract_code` if ``extract``."""
        programs = [extract_code(r) for r in responses] if extract else list(responses)
        results = self.score(programs, suites)
        return [code_reward(r, self.scheme) for r in results], results

    def rewards(
        self, responses: Sequence[str], suites: Sequence[TestSuite], *, extract: bool = True
    ) -> list[float]:
        """Rewards (B,) for model responses; code is taken with :func:`extract_code` if ``extract``."""
        return self.evaluate(responses, suites, extract=extract)[0]

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> CodeRewarder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(response: str) -> str:
    """The program in a model response.

    The first fenced block tagged ``python``/``py``/``python3`` if any, else the first fenced block
    of any tag, else the whole text. An unterminated fence (generation cut off) runs to the end.

    >>> extract_code("Here:\\n```python\\nprint(1)\\n```\\nDone.")
    'print(1)\\n'
    >>> extract_code("print(2)")
    'print(2)'
    """
    blocks = _FENCE.findall(response)
    for tag, body in blocks:
        if tag.lower() in ("python", "py", "python3"):
            return body
    if blocks:
        return blocks[0][1]
    return response


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021, eq. 1).

    ``1 - C(n-c, k) / C(n, k)``, computed as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)`` to avoid huge
    binomials.
    """
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n, 1 <= k <= n; got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def batched_pass_at_k(n: int | Sequence[int], c: Sequence[int], k: int) -> list[float]:
    """pass@k per problem; ``n`` is the sample count (one for all problems, or one per problem).
    Average the list for the benchmark's pass@k."""
    ns = [n] * len(c) if isinstance(n, int) else list(n)
    if len(ns) != len(c):
        raise ValueError(f"{len(ns)} sample counts but {len(c)} correct counts")
    return [pass_at_k(ni, ci, k) for ni, ci in zip(ns, c, strict=True)]
