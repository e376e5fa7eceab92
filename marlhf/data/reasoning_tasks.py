"""Multi-step arithmetic with a verifiable answer: reasoning tasks whose solution is written one step
per line and whose reward is the final answer alone (RLVR).

The long-horizon tasks (``marlhf.data.long_tasks``) score a whole answer with partial credit. These
tasks ask for a chain of dependent steps, each a line, and pay only for the result at the end: a
slip at step 2 of 16 makes every later line wrong and costs the whole reward, however well the rest
is computed. That is the setting of reasoning RL (a final-answer checker, RLVR) and of
macro actions at reasoning steps (one line, one macro action).

Task ``synthetic-arith-{4,8,16}``: a rule applied 4, 8 or 16 times
-------------------------------------------------------------------
A start number (1-99) and ``k`` operations labelled ``A``, ``B``, ... (``LABELS``), each ``+`` or
``-`` an operand 1-9. The generator draws one operation per problem (the rule) and writes it at every
step, with a start that keeps every running total within 0-99. The start comes last, on the line
that opens the solution::

    Task:
    A-4
    B-4
    C-4
    D-4
    Solution: start is 25.

The solution writes one line per operation: its line of the prompt, a colon, the running total it
applies to with the operation again, and the new total after ``is`` and before a period; it ends
with an answer line (no newline after it; the model's EOS follows)::

    A-4: 25-4 is 21.
    B-4: 21-4 is 17.
    C-4: 17-4 is 13.
    D-4: 13-4 is 9.
    answer: 9

The text states any list of operations (``prompt_text``, ``read_problem`` and the scorer take one
per step); one rule per problem is what the shipped 2-layer base can read. Every value of a line is
then within its reach: the label follows the label of the line above, the operation is the line
above's (the prompt's line of its label for the first), the total it starts from is the number
after the latest ``is`` (the prompt's ``start is 25.`` for the first line, at the same distance
from it as a line's total from the line above's), and the answer line follows the line of the
prompt's last label. Formats it could not read, teacher-forced (the research page "The tasks and
their tiny models"): with the start on the prompt's first line (``Task: start is 25.``), the first
line's total sat a prompt's length (38-86 tokens) after it, and the base read its units digit 0.21
of the time on two-digit starts; with a different operation at each step, a line must look its
step's operation up by its label; a base pretrained on it (1,500 steps) read the start (1.00) and
computed the sums (0.99) but found the sign (0.66; the totals' bounds alone give about 0.6) and the
operand (0.44) of its step poorly, and answered 3-6 % of 4-step problems right, like one on an
earlier format (``1: plus 5`` in the prompt, ``1: plus 5 to 7 is 12`` in the solution) that read
none of the three. A one-line problem (``start is 25, rule -4, steps 4.``) with lines labelled by
the steps left (``4: -4 to 25 is 21.``) was read worse: after 950 steps the first line's operand
was at chance (0.12) and the labels did not count down.

Numbers are written in digits: the tiny tokenizer (byte-level BPE, no ``<unk>``) spells each digit
as one token, so a line is 13-15 tokens and a solution 68 (59-68), 128 (122-128) and 246 (228-248)
tokens at 4, 8 and 16 steps, prompts 38, 54 and 86 tokens (300 held-out problems each;
``tests/data/test_reasoning_tasks.py`` checks the bands). The problem space is small (1,431, 1,071
and 522 problems at 4, 8 and 16 steps): the held-out problems (``held_out_prompts``) are kept out of
the train split and of the pretraining corpus.

The gold score: the final answer alone
--------------------------------------
``arith_gold(prompt, response)`` reads text only: the start and the operations from the prompt (the
true result), and from the response the first line that starts with ``answer:``. It is 1.0 when that
line holds exactly the true result (an integer, optional spaces and a final period) and 0.0
otherwise: a wrong number, an answer line with other words on it, no answer line at all. Text after
the answer line is not read. The steps are not checked: a chain with two slips that cancel earns
the reward (as with any final-answer checker). No extra penalty for a missing answer line: the mean
gold of a batch is then its accuracy, and an answer cut off by the length limit is already charged
by PPO's no-EOS penalty.

Slips: what the pretrained base gets wrong
------------------------------------------
A slip is one wrong line, after which the chain carries on consistently from the wrong total (as a
person who slipped would): ``units`` (the new total off by 1 or 2), ``carry`` (off by 10),
``operator`` (the line applies the other operation: ``B+3: 12+3 is 15.`` for ``B-3``) and
``operand`` (it copies another operand: ``B-4: 12-4 is 8.``). Every running total of a slipped
chain stays within 0-99, and its final answer is wrong (plus and minus shift every later total by
the slip's error).

Preference data and pretraining corpus
--------------------------------------
``generate(task, n, seed, split)`` writes ``{"id", "prompt", "chosen", "rejected", "answer",
"steps", "kind"}`` rows: ``chosen`` the correct solution, ``rejected`` a wrong one (``kind``: one
slip of the kinds above at a random step, or ``wrong_final``, a correct chain whose answer line does
not copy the last total, or ``truncated``, a correct chain cut off before its answer line). The
data path ``synthetic-arith-4`` (etc.) generates ``N_TRAIN`` train and ``N_VALID`` valid rows on
first use into ``$MARLHF_HOME/synthetic`` (``data_file``: a directory with ``train.jsonl`` and
``valid.jsonl``). Its adapter gives SFT the chosen solution, the reward stage both, and PPO the
prompt with ``meta["columns"]["answer"]``, the true result (what an answer-checking reward reads).
``pretraining_rows(n)`` is the corpus of the pretrained base ``tiny-base-arith``
(``marlhf.pipeline.recipes``): problems of 2-16 steps whose first line applies the other operation
with probability ``PRETRAIN_FIRST_FLIP`` (one early decision, made either way, that decides the
final answer) and whose lines slip with probability ``PRETRAIN_SLIP``, so that a base which learns
the corpus samples right answers only part of the time, and less often the longer the chain
(``pretraining.json`` has the shipped base's figures).

>>> p = "Task:\\nA+5\\nB-3\\nSolution: start is 7.\\n"
>>> true_result(p)
9
>>> arith_gold(p, "A+5: 7+5 is 12.\\nB-3: 12-3 is 9.\\nanswer: 9")
1.0
>>> arith_gold(p, "A+5: 7+5 is 13.\\nB-3: 13-3 is 10.\\nanswer: 10")
0.0
>>> arith_gold(p, "A+5: 7+5 is 12.\\nB-3: 12-3 is 9.")  # no answer line
0.0
>>> solution(7, [("plus", 5), ("minus", 3)])
'A+5: 7+5 is 12.\\nB-3: 12-3 is 9.\\nanswer: 9'
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from marlhf.runtime.home import home

# Bump when the generator or the scorer changes (the generated files' names and cache keys hold it).
ARITH_VERSION = 3
STEPS = (4, 8, 16)
START = (1, 99)  # the start number, both bounds included
OPERAND = (1, 9)
MAX_TOTAL = 99  # every running total, true or slipped, stays within 0..MAX_TOTAL
OPS = ("plus", "minus")
SIGNS = {"plus": "+", "minus": "-"}
# The step labels, one token each in the tiny tokenizer and none a token of the fixed words.
LABELS = "ABCDEFGHIJKLMNOP"
SLIP_KINDS = ("units", "carry", "operator", "operand")
REJECTED_KINDS = (*SLIP_KINDS, "wrong_final", "truncated")
# The numbers of comparisons a data path generates (as many as the long-horizon tasks').
N_TRAIN, N_VALID = 1900, 300
# Pretraining corpus of tiny-base-arith: step counts drawn uniformly from PRETRAIN_STEPS, the first
# line applying the other operation with probability PRETRAIN_FIRST_FLIP, each line slipping with
# probability PRETRAIN_SLIP (see ``pretraining_rows``).
PRETRAIN_STEPS = (2, 16)
PRETRAIN_SLIP = 0.08
PRETRAIN_FIRST_FLIP = 0.5

Op = tuple[str, int]

_START = re.compile(r"start is (\d+)\.")
_OP_LINE = re.compile(r"^([A-Z])([+-])(\d+)$", re.MULTILINE)
_ANSWER_LINE = re.compile(r"^\s*answer\s*:(.*)$", re.IGNORECASE)
_ANSWER_VALUE = re.compile(r"\s*(-?\d+)\s*\.?\s*")
_LINE_TOTAL = re.compile(r" is (-?\d+)\.$")
# the first step line: label A with its operation, the total it starts from, the operation again
_STEP_LINE = re.compile(r"^A([+-]\d+): (\d+)([+-]\d+) is -?\d+\.$")


@dataclass(frozen=True)
class ArithTask:
    """One task: its data path and its number of operations (steps)."""

    name: str
    steps: int


TASKS: dict[str, ArithTask] = {
    t.name: t for t in (ArithTask(f"synthetic-arith-{k}", k) for k in STEPS)
}


# --- text: prompt, solution, reading them back ---------------------------------------------------
def apply(total: int, op: Op) -> int:
    """The running total after ``op``: ``apply(12, ("minus", 3)) == 9``."""
    name, operand = op
    return total + operand if name == "plus" else total - operand


def prompt_text(start: int, ops: list[Op]) -> str:
    """The prompt of a problem: ``Task:``, the labelled operations, then ``Solution: start is N.``
    and a newline."""
    lines = ["Task:"]
    lines += [f"{LABELS[i]}{SIGNS[name]}{operand}" for i, (name, operand) in enumerate(ops)]
    return "\n".join(lines) + f"\nSolution: start is {start}.\n"


def step_line(i: int, total: int, op: Op, result: int) -> str:
    """Line ``i`` (1-based) of a solution: ``B-3: 12-3 is 9.``, ``C+8: 9+8 is 17.``."""
    written = f"{SIGNS[op[0]]}{op[1]}"
    return f"{LABELS[i - 1]}{written}: {total}{written} is {result}."


def solution(start: int, ops: list[Op]) -> str:
    """The correct solution: one line per operation, then ``answer: RESULT``."""
    lines, total = [], start
    for i, op in enumerate(ops, 1):
        new = apply(total, op)
        lines.append(step_line(i, total, op, new))
        total = new
    return "\n".join([*lines, f"answer: {total}"])


def read_problem(prompt: str) -> tuple[int, list[Op]]:
    """The start and the operations of the problem in ``prompt`` (the operations before
    ``Solution:``, the start after it).

    Raises:
        ValueError: the prompt holds no ``synthetic-arith`` problem (no start, no operations, or
            operations not labelled A, B, ...).
    """
    problem, _, opening = prompt.partition("Solution:")
    start = _START.match(opening.strip())
    found = _OP_LINE.findall(problem)
    if (
        start is None
        or not found
        or "".join(label for label, _, _ in found) != LABELS[: len(found)]
    ):
        raise ValueError(f"not a synthetic-arith prompt: {prompt[:80]!r}")
    names = {sign: name for name, sign in SIGNS.items()}
    return int(start.group(1)), [(names[sign], int(operand)) for _, sign, operand in found]


def true_result(prompt: str) -> int:
    """The result of the problem in ``prompt`` (``read_problem``)."""
    start, ops = read_problem(prompt)
    total = start
    for op in ops:
        total = apply(total, op)
    return total


def final_answer(response: str) -> int | None:
    """The integer on the first line of ``response`` that starts with ``answer:``; None when there
    is no such line or it holds anything but one integer (and an optional final period)."""
    for line in response.split("\n"):
        m = _ANSWER_LINE.match(line)
        if m is not None:
            value = _ANSWER_VALUE.fullmatch(m.group(1))
            return int(value.group(1)) if value is not None else None
    return None


def line_accuracy(prompt: str, response: str) -> tuple[int, int]:
    """Step lines of ``response`` that are right, and step lines written (those before its answer
    line). Line ``j`` is right when it is exactly ``step_line(j, prev, op_j, prev op_j)``, ``prev``
    being the total the line before it wrote (the start for line 1): a local check, so one slip
    counts once and the lines after it that carry on correctly from it count as right.

    >>> line_accuracy("Task:\\nA+5\\nB-3\\nSolution: start is 7.\\n",
    ...               "A+5: 7+5 is 13.\\nB-3: 13-3 is 10.\\nanswer: 10")
    (1, 2)
    """
    start, ops = read_problem(prompt)
    prev, right, lines = start, 0, 0
    for j, line in enumerate(response.split("\n"), 1):
        if _ANSWER_LINE.match(line):
            break
        lines += 1
        right += j <= len(ops) and line == step_line(j, prev, ops[j - 1], apply(prev, ops[j - 1]))
        written = _LINE_TOTAL.search(line)
        if written is not None:
            prev = int(written.group(1))
    return right, lines


def first_line(prompt: str, response: str) -> dict[str, bool]:
    """What the first line of ``response`` makes of the problem: ``start_read`` (it starts from the
    prompt's start number), ``operation_right`` (it writes step A's operation, in its label and in
    its sum) and ``right`` (the whole line is the correct one).

    >>> first_line("Task:\\nA+5\\nSolution: start is 27.\\n", "A-5: 27-5 is 22.\\nanswer: 22")
    {'start_read': True, 'operation_right': False, 'right': False}
    """
    start, ops = read_problem(prompt)
    line = response.split("\n", 1)[0]
    parsed = _STEP_LINE.match(line)
    written = f"{SIGNS[ops[0][0]]}{ops[0][1]}"
    return {
        "start_read": parsed is not None and int(parsed.group(2)) == start,
        "operation_right": parsed is not None and parsed.group(1) == parsed.group(3) == written,
        "right": line == step_line(1, start, ops[0], apply(start, ops[0])),
    }


def arith_gold(prompt: str, response: str) -> float:
    """Gold score of ``response`` on a ``synthetic-arith-*`` prompt (module docstring): 1.0 when its
    answer line gives the true result, else 0.0."""
    answer = final_answer(response)
    return 1.0 if answer is not None and answer == true_result(prompt) else 0.0


# --- generator -----------------------------------------------------------------------------------
def make_problem(steps: int, rng: random.Random) -> tuple[int, list[Op]]:
    """A start number and a rule applied ``steps`` times (the operations, one per step) whose
    running totals stay within 0..MAX_TOTAL: the operand uniform among those that fit ``steps``
    times, the sign uniform, the start uniform among those that keep every total in range."""
    operand = rng.randint(OPERAND[0], min(OPERAND[1], (MAX_TOTAL - START[0]) // steps))
    name = rng.choice(OPS)
    if name == "plus":
        start = rng.randint(START[0], MAX_TOTAL - operand * steps)
    else:
        start = rng.randint(max(START[0], operand * steps), START[1])
    return start, [(name, operand)] * steps


def _slipped_line(kind: str, total: int, op: Op, rng: random.Random) -> tuple[Op, int]:
    """The operation a slipped line writes and the total it reaches (``kind``: module docstring)."""
    name, operand = op
    right = apply(total, op)
    if kind == "units":
        return op, right + rng.choice((-2, -1, 1, 2))
    if kind == "carry":
        return op, right + rng.choice((-10, 10))
    if kind == "operator":
        written = ("minus" if name == "plus" else "plus", operand)
        return written, apply(total, written)
    other = rng.choice([v for v in range(OPERAND[0], OPERAND[1] + 1) if v != operand])
    return (name, other), apply(total, (name, other))


def slipped_lines(
    start: int, ops: list[Op], slips: dict[int, str], rng: random.Random
) -> list[str] | None:
    """The step lines of a chain that slips at the 0-based steps of ``slips`` (step -> kind) and
    carries on from its own totals; None when a total would leave 0..MAX_TOTAL."""
    lines, total = [], start
    for i, op in enumerate(ops):
        if i in slips:
            written, new = _slipped_line(slips[i], total, op, rng)
        else:
            written, new = op, apply(total, op)
        if not 0 <= new <= MAX_TOTAL:
            return None
        lines.append(step_line(i + 1, total, written, new))
        total = new
    return lines


def _last_total(lines: list[str]) -> int:
    return int(_LINE_TOTAL.search(lines[-1]).group(1))


def wrong_solution(kind: str, start: int, ops: list[Op], rng: random.Random) -> str:
    """A solution of kind ``kind`` (``REJECTED_KINDS``) whose final answer is wrong, or which has no
    answer line (``truncated``)."""
    if kind not in REJECTED_KINDS:
        raise ValueError(f"unknown solution kind {kind!r}; known: {', '.join(REJECTED_KINDS)}")
    right = solution(start, ops).split("\n")
    if kind == "truncated":
        return "\n".join(right[: rng.randint(1, len(ops))])
    if kind == "wrong_final":
        result = _last_total(right[:-1])
        wrong = [v for v in range(0, MAX_TOTAL + 1) if abs(v - result) in (1, 2, 10)]
        return "\n".join([*right[:-1], f"answer: {rng.choice(wrong)}"])
    for _ in range(100):
        lines = slipped_lines(start, ops, {rng.randrange(len(ops)): kind}, rng)
        if lines is not None and _last_total(lines) != _last_total(right[:-1]):
            return "\n".join([*lines, f"answer: {_last_total(lines)}"])
    # a slip of this kind fits nowhere in the chain (every total near a bound): a units slip does
    return wrong_solution("units" if kind != "units" else "wrong_final", start, ops, rng)


def generate(
    task: str | ArithTask, n: int, seed: int, split: str = "train", id_offset: int = 0
) -> list[dict]:
    """``n`` rows of ``task``: ``{"id", "prompt", "chosen", "rejected", "answer", "steps", "kind"}``
    (module docstring). Deterministic in all arguments."""
    task = TASKS[task] if isinstance(task, str) else task
    rng = random.Random(f"{task.name}/{seed}/{split}")
    held = held_out_prompts() if split != "valid" else frozenset()
    rows = []
    for i in range(n):
        start, ops = make_problem(task.steps, rng)
        while prompt_text(start, ops) in held:
            start, ops = make_problem(task.steps, rng)
        kind = rng.choice(REJECTED_KINDS)
        chosen = solution(start, ops)
        rows.append(
            {
                "id": f"arith{task.steps}-{id_offset + i:06d}",
                "prompt": prompt_text(start, ops),
                "chosen": chosen,
                "rejected": wrong_solution(kind, start, ops, rng),
                "answer": int(chosen.rsplit(" ", 1)[1]),
                "steps": task.steps,
                "kind": kind,
            }
        )
    return rows


@functools.cache
def held_out_prompts() -> frozenset[str]:
    """The prompts of the held-out problems: the first ``N_VALID`` ``valid`` rows (seed 0) of each
    task. No other split and no pretraining row holds one (the problem space is small)."""
    return frozenset(
        r["prompt"] for name in TASKS for r in generate(name, N_VALID, 0, "valid", N_TRAIN)
    )


def data_file(name: str) -> Path:
    """The directory of the data path ``name``: ``train.jsonl`` (``N_TRAIN`` rows) and
    ``valid.jsonl`` (``N_VALID``), generated on first use into ``$MARLHF_HOME/synthetic`` (atomic;
    safe with several ranks)."""
    if name not in TASKS:
        raise ValueError(
            f"--data_path: {name!r} is not a synthetic arithmetic task; known: {', '.join(TASKS)}"
        )
    target = home() / "synthetic" / f"{name}-v{ARITH_VERSION}"
    if (target / "valid.jsonl").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}-"))
    try:
        splits = {
            "train": generate(name, N_TRAIN, 0, "train"),
            "valid": generate(name, N_VALID, 0, "valid", id_offset=N_TRAIN),
        }
        for split, rows in splits.items():
            with open(tmp / f"{split}.jsonl", "w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row) + "\n")
            os.chmod(tmp / f"{split}.jsonl", 0o644)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache may be shared
        try:
            os.rename(tmp, target)
        except OSError:  # another process published it first
            if not (target / "valid.jsonl").is_file():
                raise
    finally:
        if tmp.exists():
            for p in tmp.iterdir():
                p.unlink()
            tmp.rmdir()
    return target


def pretraining_rows(
    n: int, seed: int = 0, slip: float = PRETRAIN_SLIP, first_flip: float = PRETRAIN_FIRST_FLIP
) -> list[dict]:
    """``n`` problems of ``PRETRAIN_STEPS`` steps (uniform) with a solution each, as ``{"id",
    "prompt", "chosen"}`` rows: the corpus of ``tiny-base-arith``.

    The first line applies the other operation with probability ``first_flip`` (an ``operator``
    slip; not where the chain it starts would leave 0..MAX_TOTAL): the early decision the base makes
    either way and the final answer pays for. Each line slips with probability ``slip`` (a kind of
    ``SLIP_KINDS`` at random; the chain goes on from the slipped total, and the answer line copies
    the last total), as a noisy worked-solutions corpus would: a base that learns it samples slips
    about that often, so its answers are right only part of the time, less often the longer the
    chain, and RL has the slips to remove. The random stream (``"arith-pretrain/{seed}"``) is not
    the one of the comparisons."""
    rng = random.Random(f"arith-pretrain/{seed}")
    rows = []
    for i in range(n):
        start, ops = make_problem(rng.randint(*PRETRAIN_STEPS), rng)
        while prompt_text(start, ops) in held_out_prompts():
            start, ops = make_problem(len(ops), rng)
        # an operator slip draws nothing from rng, so this check leaves the stream as it is
        flip = rng.random() < first_flip and slipped_lines(start, ops, {0: "operator"}, rng)
        lines = None
        while lines is None:
            slips = {j: rng.choice(SLIP_KINDS) for j in range(len(ops)) if rng.random() < slip}
            if flip:
                slips[0] = "operator"
            lines = slipped_lines(start, ops, slips, rng)
        text = "\n".join([*lines, f"answer: {_last_total(lines)}"])
        rows.append({"id": i, "prompt": prompt_text(start, ops), "chosen": text})
    return rows
