"""``marlhf infer --env`` on the vLLM backend, on the bundled trail task: the written turns are
those a replay of the game gives for the written policy texts (tests/inference/test_episodes.py),
within ``--max_turns``; each policy turn's written tokens are its text (the rows record no
log-probs); a row plays the same episode in a batch of another size (its turns drawn from its own
seeds); greedy episodes are those of the ``hf`` backend, which feeds the model the whole
conversation every turn: vLLM, sent the conversation whole with its prefix cache serving what it
has read, continues the same conversations. Runs where vLLM is installed (``make test-vllm``), with
skyrl-gym (requirements-vllm.txt)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")

from transformers import AutoTokenizer  # noqa: E402

from marlhf.data import trail  # noqa: E402
from marlhf.inference import read_rows  # noqa: E402
from marlhf.inference.run import main  # noqa: E402
from marlhf.models.conversation import ChatLayout  # noqa: E402
from marlhf.models.load import resolve_model_path  # noqa: E402
from tests.inference.test_episodes import TRAIL, replay  # noqa: E402

pytestmark = pytest.mark.slow

MAX_TURNS = 3
MAX_ANSWER = 8
# vLLM's engine holds a whole conversation as one prompt: --max_prompt_seq_len reaches it
LENGTHS = ["--max_prompt_seq_len", "160", "--max_total_seq_len", "160", "--disable_progress_bar"]
SAMPLED = ["--temperature", "1.0", "--top_k", "0"]
GAMES = {r["id"]: r for r in trail.rows(4, 6, seed=0, split="valid")}  # the held-out games


def play(out: Path, backend: str, *flags: str, batch: int = 2) -> tuple[dict, list[dict]]:
    summary = main([
        *TRAIL, *LENGTHS, "--output", str(out), "--env", "marlhf-trail-4", "--dataset",
        "marlhf-trail-4:6", "--num-samples", "5", "--batch-size", str(batch), "--max_turns",
        str(MAX_TURNS), "--env_config", '{"step_reward": 0.25}', "--env_timeout_s", "0",
        "--generation_backend", backend, "--save_token_ids", "--dtype", "fp32", *flags,
    ])  # fmt: skip
    rows = read_rows(str(out))
    assert summary["n"] == len(rows) == 5
    return summary, rows


def check_tokens(rows: list[dict], tok, eos: list[int]) -> None:
    """Each policy turn's written tokens are its text, at most --max_answer_seq_len of them, the
    last an end-of-turn token where the turn says it ended with one; the row's totals add up."""
    for row in rows:
        policy = [t for t in row["turns"] if t["role"] == "policy"]
        for t in policy:
            ids = t["token_ids"]
            assert 1 <= t["tokens"] == len(ids) <= MAX_ANSWER
            assert t["ends_with_eos"] == (ids[-1] in eos)
            body = ids[:-1] if t["ends_with_eos"] else ids
            assert tok.decode(body, skip_special_tokens=True) == t["text"]
        assert row["response_tokens"] == sum(t["tokens"] for t in policy)
        assert row["response"] == policy[-1]["text"]
        assert row["ends_with_eos"] == policy[-1]["ends_with_eos"]


def test_trail_episodes_on_vllm_replay_the_game(tmp_path):
    out = tmp_path / "vllm.jsonl"
    summary, rows = play(out, "vllm", *SAMPLED)
    tok = AutoTokenizer.from_pretrained(resolve_model_path("tiny-base-trail"))
    eos = [tok.eos_token_id, ChatLayout(tok).end_of_turn]  # its eos ends a turn of the template
    for row in rows:
        replay(row, GAMES[row["prompt_id"]], 0.25, max_turns=MAX_TURNS)
    check_tokens(rows, tok, eos)
    assert summary["turns_mean"] == pytest.approx(sum(r["num_turns"] for r in rows) / 5)
    assert summary["reward_mean"] == pytest.approx(sum(r["reward"] for r in rows) / 5)
    assert sum(r["num_turns"] for r in rows) > 5  # conversations continued past a first turn
    # each row's turns are drawn from its own seeds: the same episodes in one batch of 5
    _, one_batch = play(tmp_path / "one.jsonl", "vllm", *SAMPLED, batch=5)
    by_id = {r["prompt_id"]: r["turns"] for r in one_batch}
    assert all(by_id[r["prompt_id"]] == r["turns"] for r in rows)


def test_greedy_episodes_on_vllm_are_those_of_rereading(tmp_path):
    """With ``--top_k 1`` every turn is the argmax of the policy given its conversation: vLLM's
    turns are the ``hf`` backend's, which feeds the model the whole conversation every turn."""
    _, ref = play(tmp_path / "hf.jsonl", "hf", "--top_k", "1")
    _, got = play(tmp_path / "vllm.jsonl", "vllm", "--top_k", "1")
    assert sum(r["num_turns"] for r in ref) > 5
    by_id = {r["prompt_id"]: r for r in ref}
    for row in got:
        replay(row, GAMES[row["prompt_id"]], 0.25, max_turns=MAX_TURNS)
        want = by_id[row["prompt_id"]]
        assert [t.get("token_ids") for t in row["turns"]] == [
            t.get("token_ids") for t in want["turns"]
        ]
        assert row["turns"] == want["turns"]
