"""The multi-step arithmetic tasks (``marlhf.data.reasoning_tasks``): gold scorer, generator, data
paths in the stages' datasets."""

import doctest
import json
import random
import statistics

import pytest

import marlhf.data.reasoning_tasks as R
from marlhf.data.config import DataConfig
from marlhf.data.long_tasks import gold_scorer_for
from marlhf.data.sources import load_examples

# start 25, then 25 + 8 = 33, 33 - 9 = 24, 24 + 7 = 31, 31 - 4 = 27: worked by hand
PROMPT = "Task:\nA+8\nB-9\nC+7\nD-4\nSolution: start is 25.\n"
RIGHT = "A+8: 25+8 is 33.\nB-9: 33-9 is 24.\nC+7: 24+7 is 31.\nD-4: 31-4 is 27.\nanswer: 27"
# a carry slip at step 1 (23 for 33), carried on consistently: the final answer is 10 short
SLIPPED = "A+8: 25+8 is 23.\nB-9: 23-9 is 14.\nC+7: 14+7 is 21.\nD-4: 21-4 is 17.\nanswer: 17"


def _tokenizer():
    from transformers import AutoTokenizer

    from marlhf.models.zoo import BASE_DIR

    return AutoTokenizer.from_pretrained(BASE_DIR)


def _totals(prompt: str) -> list[int]:
    """The running totals of a prompt's problem, read with a regex of this test (not the module's)."""
    import re

    total = int(re.search(r"start is (\d+)", prompt).group(1))
    out = [total]
    for op, n in re.findall(r"^[A-P]([+-])(\d)$", prompt, re.MULTILINE):
        total += int(n) if op == "+" else -int(n)
        out.append(total)
    return out


def test_doctests():
    assert doctest.testmod(R).failed == 0


def test_gold_scores_the_final_answer_of_hand_worked_solutions():
    assert R.true_result(PROMPT) == 27
    assert R.read_problem(PROMPT) == (25, [("plus", 8), ("minus", 9), ("plus", 7), ("minus", 4)])
    assert R.solution(25, R.read_problem(PROMPT)[1]) == RIGHT
    assert R.arith_gold(PROMPT, RIGHT) == 1.0
    assert R.arith_gold(PROMPT, SLIPPED) == 0.0
    # a wrong final line after right steps, and the right number without an answer line
    assert R.arith_gold(PROMPT, RIGHT.replace("answer: 27", "answer: 28")) == 0.0
    assert R.arith_gold(PROMPT, RIGHT.rsplit("\n", 1)[0]) == 0.0
    assert R.arith_gold(PROMPT, "27") == 0.0 and R.arith_gold(PROMPT, "") == 0.0
    # the steps are not checked: wrong steps with the right answer line earn the reward
    assert R.arith_gold(PROMPT, SLIPPED.replace("answer: 17", "answer: 27")) == 1.0
    assert R.arith_gold(PROMPT, "answer: 27") == 1.0
    # text after the answer line is not read; spaces, a final period and capitals are accepted
    assert R.arith_gold(PROMPT, RIGHT + "\nE+1: 27+1 is 28.\nanswer: 28") == 1.0
    assert R.arith_gold(PROMPT, "Answer :  27 .") == 1.0
    # only the first answer line counts, and it must hold one integer and nothing else
    assert R.arith_gold(PROMPT, "answer: 26\nanswer: 27") == 0.0
    assert R.arith_gold(PROMPT, "answer: 27 apples") == 0.0
    assert R.arith_gold(PROMPT, "answer: 27 or 28") == 0.0
    assert R.arith_gold(PROMPT, "the answer: 27") == 0.0  # the line must start with "answer:"
    with pytest.raises(ValueError, match="not a synthetic-arith prompt"):
        R.arith_gold("POST\nMy dog ate my lunch.\nTL;DR: ", "answer: 1")
    with pytest.raises(ValueError, match="not a synthetic-arith prompt"):  # steps A, C: no B
        R.arith_gold("Task:\nA+1\nC+1\nSolution: start is 2.\n", "answer: 4")


def test_first_line_reads_the_start_and_the_operation_apart():
    assert R.first_line(PROMPT, RIGHT) == dict(start_read=True, operation_right=True, right=True)
    flipped = "A-8: 25-8 is 17.\nanswer: 17"
    assert R.first_line(PROMPT, flipped) == dict(
        start_read=True, operation_right=False, right=False
    )
    misread = "A+8: 23+8 is 31."
    assert R.first_line(PROMPT, misread) == dict(
        start_read=False, operation_right=True, right=False
    )
    assert R.first_line(PROMPT, SLIPPED) == dict(start_read=True, operation_right=True, right=False)
    # the operation restated differently in the sum, and a line that is not a step line
    assert not R.first_line(PROMPT, "A+8: 25-8 is 17.")["operation_right"]
    assert not any(R.first_line(PROMPT, "answer: 27").values())


def test_line_accuracy_counts_each_slip_once():
    assert R.line_accuracy(PROMPT, RIGHT) == (4, 4)
    assert R.line_accuracy(PROMPT, SLIPPED) == (3, 4)  # the later lines go on right from 23
    copied = RIGHT.replace("B-9: 33-9 is 24.", "B-8: 33-8 is 25.")  # wrong operand
    # line C ("24+7") does not go on from the 25 of line B; line D follows from line C's 31
    assert R.line_accuracy(PROMPT, copied) == (2, 4)
    assert R.line_accuracy(PROMPT, RIGHT + "\n") == (4, 4)
    assert R.line_accuracy(PROMPT, "A+8: 25+8 is 33.\nhello") == (1, 2)
    # a line that applies its operation right but restates another one is wrong
    assert R.line_accuracy(PROMPT, "A+8: 25+7 is 33.") == (0, 1)


@pytest.mark.parametrize("name", sorted(R.TASKS))
def test_generated_problems_and_solutions(name):
    steps = R.TASKS[name].steps
    rows = R.generate(name, 200, seed=3)
    assert rows == R.generate(name, 200, seed=3)  # deterministic per seed
    assert rows != R.generate(name, 200, seed=4) and rows != R.generate(name, 200, 3, "valid")
    kinds = set()
    for row in rows:
        totals = _totals(row["prompt"])
        assert len(totals) == steps + 1 and all(0 <= t <= R.MAX_TOTAL for t in totals)
        assert len(set(R.read_problem(row["prompt"])[1])) == 1  # one rule per problem
        assert row["answer"] == totals[-1] == R.true_result(row["prompt"])
        assert row["chosen"].split("\n")[-1] == f"answer: {totals[-1]}"
        written = [int(x.rsplit(" ", 1)[1].strip(".")) for x in row["chosen"].split("\n")]
        assert written == totals[1:] + [totals[-1]]
        assert R.arith_gold(row["prompt"], row["chosen"]) == 1.0
        assert R.arith_gold(row["prompt"], row["rejected"]) == 0.0
        right, lines = R.line_accuracy(row["prompt"], row["rejected"])
        if row["kind"] in R.SLIP_KINDS:  # exactly one slipped line, every total within 0..99
            assert (right, lines) == (steps - 1, steps), row
            written = [int(x.rsplit(" ", 1)[1].strip(".")) for x in row["rejected"].split("\n")]
            assert all(0 <= t <= R.MAX_TOTAL for t in written)
        elif row["kind"] == "truncated":
            assert R.final_answer(row["rejected"]) is None and right == lines <= steps
        kinds.add(row["kind"])
    assert kinds == set(R.REJECTED_KINDS)


def test_token_lengths_follow_the_steps_and_the_tokenizer_knows_every_character():
    tok = _tokenizer()
    bands = {4: (62, 70), 8: (122, 132), 16: (238, 252)}  # solutions: about 15 tokens per step
    for name, task in R.TASKS.items():
        rows = R.generate(name, 50, 0, "valid", R.N_TRAIN)
        answers = [tok(r["chosen"], add_special_tokens=False)["input_ids"] for r in rows]
        prompts = [tok(r["prompt"])["input_ids"] for r in rows]
        lo, hi = bands[task.steps]
        assert lo <= statistics.mean(map(len, answers)) <= hi, name
        assert max(map(len, prompts)) + max(map(len, answers)) < 479, name  # ARITH_FLAGS: 480
        for r, ids in zip(rows, answers, strict=True):
            assert tok.unk_token_id not in ids
            assert tok.decode(ids) == r["chosen"]  # every character spelt, nothing lost


def test_pretraining_rows_slip_at_the_stated_rate():
    rows = R.pretraining_rows(600)
    assert rows[:10] == R.pretraining_rows(10) and rows[:10] != R.pretraining_rows(10, seed=1)
    right = lines = 0
    steps = []
    for r in rows:
        n_ops = len(R.read_problem(r["prompt"])[1])
        steps.append(n_ops)
        a, b = R.line_accuracy(r["prompt"], r["chosen"])
        right, lines = right + a, lines + b
        assert b == n_ops and R.final_answer(r["chosen"]) is not None
    assert set(steps) == set(range(R.PRETRAIN_STEPS[0], R.PRETRAIN_STEPS[1] + 1))
    # half the first lines apply the other operation; every line slips at PRETRAIN_SLIP on top
    firsts = [R.first_line(r["prompt"], r["chosen"]) for r in rows]
    flipped = sum(f["start_read"] and not f["operation_right"] for f in firsts) / len(rows)
    # 600 first lines; a flip that does not fit is skipped, an operand slip also counts here
    assert abs(flipped - R.PRETRAIN_FIRST_FLIP) < 0.07
    assert all(f["start_read"] for f in firsts)  # a flip or a slip keeps the start
    later_right = right - sum(f["right"] for f in firsts)
    assert abs((1 - later_right / (lines - len(rows))) - R.PRETRAIN_SLIP) < 0.02  # 4,400 lines
    assert R.pretraining_rows(50, slip=0.0) != rows[:50]
    exact = R.pretraining_rows(50, slip=0.0, first_flip=0.0)
    assert all(R.arith_gold(r["prompt"], r["chosen"]) for r in exact)
    # the held-out problems (the valid split) are in neither the corpus nor the train split
    held_out = {r["prompt"] for n in R.TASKS for r in R.generate(n, R.N_VALID, 0, "valid", 1900)}
    assert held_out == R.held_out_prompts()
    assert not held_out & {r["prompt"] for r in R.pretraining_rows(4000)}
    assert not held_out & {r["prompt"] for n in R.TASKS for r in R.generate(n, R.N_TRAIN, 0)}


def test_data_path_generates_once_and_loads_with_the_answer(tmp_path, monkeypatch):
    from marlhf.data.tokenize import _source_fingerprint

    monkeypatch.setenv("MARLHF_HOME", str(tmp_path))
    train, bad = load_examples("synthetic-arith-8", "train")
    valid, _ = load_examples("synthetic-arith-8", "eval")
    assert (len(train), len(valid), bad) == (R.N_TRAIN, R.N_VALID, 0)
    folder = tmp_path / "synthetic" / f"synthetic-arith-8-v{R.ARITH_VERSION}"
    rows = [json.loads(x) for x in (folder / "valid.jsonl").read_text().splitlines()]
    assert rows[:3] == R.generate("synthetic-arith-8", 3, 0, "valid", R.N_TRAIN)
    mtime = (folder / "train.jsonl").stat().st_mtime_ns
    assert load_examples("synthetic-arith-8", "train", max_samples=3)[0] == train[:3]
    assert (folder / "train.jsonl").stat().st_mtime_ns == mtime  # not regenerated
    for ex in random.Random(0).sample(train, 20) + valid[:5]:
        assert ex.prompt_id.startswith("synthetic-arith-8/arith8-")
        assert ex.meta == {"columns": {"answer": _totals(ex.prompt)[-1]}}
        assert (
            R.arith_gold(ex.prompt, ex.chosen) == 1.0 and R.arith_gold(ex.prompt, ex.rejected) == 0
        )
    assert not {e.prompt for e in train} & {e.prompt for e in valid}
    fp = _source_fingerprint("synthetic-arith-8")
    assert fp == {"spec": "synthetic-arith-8", "generator": f"reasoning_tasks v{R.ARITH_VERSION}"}
    with pytest.raises(ValueError, match="not a synthetic arithmetic task"):
        R.data_file("synthetic-arith-5")


def test_gold_scorer_for_finds_the_arithmetic_scorer():
    from types import SimpleNamespace

    from marlhf.stages.ppo.scoring import gold_scorer

    assert gold_scorer_for("synthetic-arith-4") is R.arith_gold
    assert gold_scorer_for(["synthetic-arith-4", "synthetic-arith-16"]) is R.arith_gold
    assert gold_scorer(SimpleNamespace(data_path=("synthetic-arith-16",))) is R.arith_gold
    with pytest.raises(ValueError, match="different gold scorers"):
        gold_scorer_for(["synthetic-arith-4", "synthetic-facts-16"])


def test_sft_reward_and_ppo_datasets_of_the_data_path(tmp_path, monkeypatch):
    """The three stages' datasets of ``synthetic-arith-4``: SFT learns the chosen solution, the
    reward stage gets (right, wrong) pairs, PPO the prompts with their answer in ``meta``."""
    from marlhf.data.tokenize import build_pair_dataset, build_prompt_dataset, build_sft_dataset

    monkeypatch.setenv("MARLHF_HOME", str(tmp_path / "home"))
    tok = _tokenizer()
    cfg = DataConfig(
        data_path=("synthetic-arith-4",),
        data_split="2,4,4",
        max_seq_len=160,
        data_output_path=str(tmp_path / "cache"),
    )
    valid, _ = load_examples("synthetic-arith-4", "eval")
    by_prompt = {e.prompt: e for e in valid}  # a problem held out twice has one solution
    ids = {}
    for e in valid:
        ids.setdefault(e.prompt, set()).add(e.prompt_id)
    sft = build_sft_dataset(cfg, tok, "eval", seed=0)
    pairs = build_pair_dataset(cfg, tok, "eval", seed=0)
    prompts = build_prompt_dataset(cfg, tok, "eval", seed=0, max_prompt_len=128)[0]
    assert len(sft) + len(pairs) + len(prompts) == R.N_VALID  # phases 1, 2 and 3
    eos = tok.eos_token
    for row in sft.select(range(5)):
        text = tok.decode(row["input_ids"][1:])
        head, opening, answer = text.partition(".\n")  # the prompt ends with its start's line
        assert answer == by_prompt[head + opening].chosen + eos
        learnt = [t for t in row["labels"] if t != -100]
        assert tok.decode(learnt) == answer
    for row in pairs.select(range(5)):
        chosen = tok.decode(row["chosen_input_ids"][row["prompt_len"] :])
        rejected = tok.decode(row["rejected_input_ids"][row["prompt_len"] :])
        prompt = tok.decode(row["chosen_input_ids"][1 : row["prompt_len"]])
        assert R.arith_gold(prompt, chosen.removesuffix(eos)) == 1.0
        assert R.arith_gold(prompt, rejected.removesuffix(eos)) == 0.0
    for row in prompts.select(range(5)):
        meta = json.loads(row["meta"])
        assert meta["columns"]["answer"] == R.true_result(row["prompt"])
        assert row["prompt_id"] in ids[row["prompt"]]
