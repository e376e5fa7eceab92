"""The APPS (program synthesis) path of MA-PPO end to end: local rows in the ``codeparrot/apps``
format, the execution reward from the sandbox, and where the trainer puts it."""

import json
import sys
import time
from pathlib import Path

import pytest
import torch

from marlhf.runtime.tracking import read_metrics
from tests.support.forked import run_python
from tests.support.stage_env import stage_env as _env

ROOT = Path(__file__).resolve().parents[3]
DATA_SPLIT = "2,0,8"  # the split of run_codegemma_apps.sh
SEED = 1234  # PPOConfig.seed's default, which picks the PPO part of the rows
BIG = "7" * 5000  # beyond Python's 4300-digit int/str limit; APPS has 9000+ digit test numbers
BIG_TWICE = "1" + "5" * 4999 + "4"  # 2 * BIG, written out by hand


def _row(pid, question, tests, solutions=(), starter="", difficulty="introductory"):
    """One row as ``codeparrot/apps`` stores it: ``solutions`` and ``input_output`` are JSON text
    (``input_output`` is "" for a problem without tests)."""
    if tests is None:
        io = ""
    elif isinstance(tests, str):
        io = tests
    else:
        io = json.dumps(tests)
    return {
        "problem_id": pid,
        "question": question,
        "solutions": json.dumps(list(solutions)),
        "input_output": io,
        "difficulty": difficulty,
        "url": f"https://example.org/problem/{pid}",
        "starter_code": starter,
    }


SUM_TESTS = {"inputs": ["1 2\n", "2 2\n", "0 5\n"], "outputs": ["3\n", "4\n", "5\n"]}
TRAIN_ROWS = [
    _row(
        0,
        "Given two integers a and b on one line, print a + b.",
        SUM_TESTS,
        ["a, b = map(int, input().split())\nprint(a + b)\n"],
    ),
    _row(
        1,
        "Read an integer n and print n squared.",
        {"inputs": ["3\n", "-4\n"], "outputs": ["9\n", "16\n"]},
        ["n = int(input())\nprint(n * n)\n"],
    ),
    _row(
        2,
        "Read a word and print it reversed.",
        {"inputs": ["abc\n", "level\n"], "outputs": ["cba\n", "level\n"]},
        ["print(input()[::-1])\n"],
    ),
    _row(
        3,
        "The first line holds n, the second n integers. Print the largest.",
        {"inputs": ["3\n1 9 4\n", "1\n-2\n"], "outputs": ["9\n", "-2\n"]},
        ["input()\nprint(max(map(int, input().split())))\n"],
    ),
    _row(
        4,
        "Write add_one(x) returning x + 1.",
        {"fn_name": "add_one", "inputs": [[1], [41]], "outputs": [[2], [42]]},
        ["def add_one(x):\n    return x + 1\n"],
        starter="def add_one(x):",
    ),
    _row(
        5,
        "Given nums and target, return the indices of the two numbers adding up to target.",
        {
            "fn_name": "twoSum",
            "inputs": [[[2, 7, 11, 15], 9], [[3, 3], 6]],
            "outputs": [[0, 1], [0, 1]],
        },
        [
            "class Solution:\n    def twoSum(self, nums, target):\n"
            "        seen = {}\n        for i, x in enumerate(nums):\n"
            "            if target - x in seen:\n                return [seen[target - x], i]\n"
            "            seen[x] = i\n"
        ],
        starter="class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:",
        difficulty="interview",
    ),
    _row(  # json.dumps refuses such integers, so the JSON text is written out
        6,
        "Write double(x) returning 2 * x (x may be huge).",
        '{"fn_name": "double", "inputs": [[' + BIG + "], [3]], "
        '"outputs": [[' + BIG_TWICE + "], [6]]}",
        ["def double(x):\n    return 2 * x\n"],
        starter="def double(x):",
    ),
    _row(
        7,
        "Read a line and print how many vowels (aeiou) it has.",
        {"inputs": ["hello\n", "xyz\n"], "outputs": ["2\n", "0\n"]},
        ["print(sum(c in 'aeiou' for c in input()))\n"],
    ),
    _row(
        8,
        "Read n and print Yes if n is even, else No.",
        {"inputs": ["4\n", "7\n"], "outputs": ["Yes\n", "No\n"]},
        ["print('Yes' if int(input()) % 2 == 0 else 'No')\n"],
    ),
    _row(
        9,
        "Read n and print |n|.",
        {"inputs": ["-3\n", "5\n"], "outputs": ["3\n", "5\n"]},
        ["print(abs(int(input())))\n"],
    ),
    _row(10, "Tell a story about a cat.", None),  # APPS has problems without tests
]
TEST_ROWS = [
    _row(
        100,
        "Read a and b and print a * b.",
        {"inputs": ["2 3\n"], "outputs": ["6\n"]},
        ["a, b = map(int, input().split())\nprint(a * b)\n"],
    )
]


def _write_apps(root: Path) -> Path:
    """APPS as the hub holds it: train.jsonl and test.jsonl."""
    root.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.jsonl", TRAIN_ROWS), ("test.jsonl", TEST_ROWS)):
        with open(root / name, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from marlhf.models.zoo import build_tiny

    base = tmp_path_factory.mktemp("apps")
    return base, build_tiny(base / "actor"), _write_apps(base / "apps")


# --------------------------------------------------------------------------------------------------
# 1. the whole stage on APPS rows


@pytest.mark.slow
@pytest.mark.parametrize(
    "rule",
    [
        ["--termination_condition", "fixed", "--ngram", "10", "--save_steps", "1"],
        ["--termination_condition", "parsing", "--parser_backend", "python"],
    ],
    ids=lambda r: r[1],
)
def test_apps_ppo_runs_with_code_reward(tiny, tmp_path, rule):
    from marlhf.data.split import phase_indices

    base, actor, data = tiny
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "marlhf.stages.ppo",
        "--actor_model_name_or_path",
        str(actor),
        "--critic_model_name_or_path",
        str(actor),  # no reward model on APPS: the critic starts from the policy
        "--reward_source",
        "code",
        "--code_reward_scheme",
        "ppocoder",
        "--code_timeout_s",
        "2",
        "--code_budget_s",
        "4",
        "--code_workers",
        "2",
        "--data_path",
        str(data),
        "--data_split",
        DATA_SPLIT,
        "--data_output_path",
        str(base / "cache"),
        "--max_prompt_seq_len",
        "200",
        "--max_answer_seq_len",
        "24",
        "--per_device_generation_batch_size",
        "4",
        "--per_device_training_batch_size",
        "2",
        "--temperature",
        "1.0",
        "--top_k",
        "5",
        "--max_steps",
        "2",
        "--output_dir",
        str(out),
        "--disable_progress_bar",
        *rule,
    ]
    proc = run_python(cmd, env=_env(base), capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    # the problem without tests is among the PPO rows and is left out of the code-reward run
    ppo_rows = phase_indices(len(TRAIN_ROWS), DATA_SPLIT, 3, SEED).tolist()
    assert 10 in ppo_rows
    assert f"1 of {len(ppo_rows)} PPO prompts have no usable test cases" in proc.stderr

    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for key in (
            "code/pass_rate",
            "code/all_pass",
            "code/compile_error",
            "code/runtime_error",
            "code/timeout",
        ):
            assert 0.0 <= r[key] <= 1.0, (key, r[key])
        # PPOCoder rewards lie in [-1, 1]; without a reward model the score is the code reward
        assert -1.0 <= r["code/reward"] <= 1.0
        assert r["objective/score"] == pytest.approx(r["code/reward"], abs=1e-6)
        assert r["code/all_pass"] <= r["code/pass_rate"] + 1e-9
        assert r["code/compile_error"] + r["code/runtime_error"] <= 1.0 + 1e-9
        assert r["time/code_reward"] >= 0.0 and r["macro/mean_len"] >= 1.0
    # final and (with --save_steps 1) intermediate checkpoints load as HF model / critic
    from transformers import AutoModelForCausalLM

    from marlhf.models.reward_model import load_reward_model

    AutoModelForCausalLM.from_pretrained(out / "actor")
    load_reward_model(out / "critic")
    saved = json.loads((out / "actor" / "run_config.json").read_text())
    assert saved["ppo"]["reward_source"] == "code"
    assert saved["macro"]["termination_condition"] == rule[1]
    assert (out / "train_state" / "latest.json").exists()
    if "--save_steps" in rule:
        assert (out / "checkpoints" / "step-1" / "actor" / "config.json").exists()


# --------------------------------------------------------------------------------------------------
# 2. the reward of known programs through the trainer's scoring path

SUM_PROGRAMS = [  # for TRAIN_ROWS[0] (a + b; tests 1 2 -> 3, 2 2 -> 4, 0 5 -> 5)
    "a, b = map(int, input().split())\nprint(a + b)\n",  # correct
    "Add them:\n```python\nprint(sum(map(int, input().split())))\n```\nDone.",  # fenced, correct
    "a, b = map(int, input().split())\nprint(a + b if a < 2 else 0)\n",  # passes 2 of 3
    "print(0)\n",  # wrong output
    "def solve(:\n    pass\n",  # syntax error
    "a, b = map(int, input().split())\nprint(a // 0)\n",  # ZeroDivisionError
    "while True:\n    pass\n",  # infinite loop
]
OTHER_PROGRAMS = [  # (row, program): call-based, a LeetCode class and a 5000-digit argument
    (5, TRAIN_ROWS[5]["solutions"]),
    (6, TRAIN_ROWS[6]["solutions"]),
]
# Hand-computed rewards (code_reward's docstring), in the order SUM_PROGRAMS + OTHER_PROGRAMS.
EXPECTED = {
    "ppocoder": [1.0, 1.0, 2 / 3, 0.0, -1.0, -0.6, -0.6, 1.0, 1.0],
    "coderl": [1.0, 1.0, -0.3, -0.3, -1.0, -0.6, -0.6, 1.0, 1.0],
}


def _injected_rollout(tokenizer, prompts, rows, responses):
    """A rollout whose responses are the given texts, each ended with EOS, after its row's prompt."""
    from marlhf.models.sequences import pack_flush_left
    from marlhf.stages.ppo.rollout import Rollout

    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    p_ids = [prompts[i]["input_ids"] for i in rows]
    r_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in responses]
    B, P, A = len(rows), max(map(len, p_ids)), max(map(len, r_ids))
    prompt_ids = torch.full((B, P), pad)
    prompt_mask = torch.zeros(B, P, dtype=torch.bool)
    response_ids = torch.full((B, A), pad)
    action_mask = torch.zeros(B, A, dtype=torch.bool)
    for b, (p, r) in enumerate(zip(p_ids, r_ids, strict=True)):
        prompt_ids[b, P - len(p) :] = torch.tensor(p)  # prompts are left-padded
        prompt_mask[b, P - len(p) :] = True
        response_ids[b, : len(r)] = torch.tensor(r)
        action_mask[b, : len(r)] = True
    seq, att, start = pack_flush_left(prompt_ids, prompt_mask, response_ids, action_mask, pad)
    ends = torch.ones(B, dtype=torch.bool)
    ro = Rollout(
        seq, att, start, response_ids, action_mask, ends, [prompts[i]["prompt_id"] for i in rows]
    )
    return ro, [len(r) for r in r_ids]


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["ppocoder", "coderl"])
def test_known_programs_get_documented_rewards_on_last_token(tiny, tmp_path, scheme):
    from marlhf.config import ModelConfig
    from marlhf.data.config import DataConfig
    from marlhf.data.tokenize import build_prompt_dataset
    from marlhf.macro import MacroConfig, build_termination
    from marlhf.models.load import load_tokenizer
    from marlhf.rewards.code import CodeRewardConfig, CodeRewarder
    from marlhf.stages.ppo.config import PPOConfig, PPOStageConfig
    from marlhf.stages.ppo.scoring import Scored, sequence_scores
    from tests.support.ppo_experience import loop_experience

    base, actor, data = tiny
    tokenizer = load_tokenizer(ModelConfig(model_name_or_path=str(actor)), padding_side="left")
    # the prompts as the trainer builds them (adapter -> prompt dataset with the tests in `meta`)
    prompts, _ = build_prompt_dataset(
        DataConfig(data_path=(str(data),), data_split="0,0,1", data_output_path=str(tmp_path)),
        tokenizer,
        "train",
        SEED,
        max_prompt_len=200,
    )
    by_pid = {p["prompt_id"]: i for i, p in enumerate(prompts)}
    rows = [by_pid["apps/0"]] * len(SUM_PROGRAMS) + [by_pid[f"apps/{k}"] for k, _ in OTHER_PROGRAMS]
    responses = SUM_PROGRAMS + [json.loads(s)[0] for _, s in OTHER_PROGRAMS]
    ro, lengths = _injected_rollout(tokenizer, prompts, rows, responses)
    metas = [json.loads(prompts[i]["meta"]) for i in rows]

    cfg = PPOStageConfig(
        ppo=PPOConfig(reward_source="code", kl_ctl=0.1),
        macro=MacroConfig(termination_condition="fixed", ngram=10),
        code=CodeRewardConfig(
            code_reward_scheme=scheme, code_timeout_s=1.0, code_budget_s=2.0, code_workers=2
        ),
    )
    B, A = ro.response_ids.shape
    # old - ref = 0.25 on every token: the k1 KL penalty is -0.1 * 0.25 per token
    scored = Scored(
        old_logprobs=torch.full((B, A), -1.0),
        ref_logprobs=torch.full((B, A), -1.25),
        values=torch.zeros(B, A),
        entropy=torch.zeros(B, A),
        ref_entropy=None,
    )
    t0 = time.monotonic()
    with CodeRewarder.from_config(cfg.code) as rewarder:
        scores, stats = sequence_scores(ro, None, metas, tokenizer, cfg.ppo, rewarder)
    # the looping program is stopped by its 2 s budget; 9 programs on 2 workers stay well below 30 s
    assert time.monotonic() - t0 < 30.0
    expected = EXPECTED[scheme]
    assert scores.tolist() == pytest.approx(expected, abs=1e-6)

    exp = loop_experience(build_termination(cfg.macro, tokenizer), ro, scored, scores, cfg, 0.1)
    for b, n in enumerate(lengths):
        assert exp.rewards[b, n - 1].item() == pytest.approx(-0.025 + expected[b], abs=1e-6)
        assert exp.rewards[b, : n - 1].tolist() == pytest.approx([-0.025] * (n - 1), abs=1e-6)
        assert exp.rewards[b, n:].tolist() == [0.0] * (A - n)
    # batch metrics, counted by hand: 4 of 9 pass everything, 1 compile error, 1 exception, 1 loop
    assert stats["code/pass_rate"] == pytest.approx((4 + 2 / 3) / 9)
    assert stats["code/all_pass"] == pytest.approx(4 / 9)
    assert stats["code/compile_error"] == pytest.approx(1 / 9)
    assert stats["code/runtime_error"] == pytest.approx(1 / 9)
    assert stats["code/timeout"] == pytest.approx(1 / 9)
    assert stats["code/reward"] == pytest.approx(sum(expected) / 9)
