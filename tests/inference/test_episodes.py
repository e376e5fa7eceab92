"""``marlhf infer --env``: each prompt row an episode on the environment. The written turns are
checked against a replay of the game with the written policy texts (the trail task's rules,
:class:`marlhf.data.trail.TrailGame`, or a scripted environment's plan), the turn limit, the
backends that sample turns (``hf`` re-reads the conversation, ``static`` continues its KV cache),
an environment from a file, the reward model's score of the conversation, and the errors: one
``error:`` line naming the environment and the row, the rows of earlier batches kept."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from marlhf.data import trail
from marlhf.inference import read_rows
from marlhf.inference.run import main
from marlhf.inference.view import main as view_main
from marlhf.models.load import resolve_model_path
from marlhf.models.reward_model import RewardModel, load_reward_model, save_reward_model
from marlhf.pipeline.preflight import main as preflight_main

FAKES = str(Path(__file__).resolve().parents[1] / "support" / "fake_envs.py")
TRAIL = ["--model_name_or_path", "tiny-base-trail", "--max_answer_seq_len", "8"]
FAST = ["--max_prompt_seq_len", "64", "--max_total_seq_len", "128", "--disable_progress_bar"]


def infer(out: Path, *flags: str) -> dict:
    return main([*TRAIL, *FAST, "--output", str(out), *flags])


def replay(row: dict, world_row: dict, step_reward: float, max_turns: int) -> None:
    """The written turns are those the game plays for the written policy texts: each policy
    turn's reward is the game's, its observation the game's reply, the episode ends where the
    game says done (or at --max_turns), and the total is the sum."""
    game = trail.TrailGame(trail.World.from_info(world_row["extra_info"]), step_reward)
    turns = row["turns"]
    policy = [k for k, t in enumerate(turns) if t["role"] == "policy"]
    assert row["num_turns"] == len(policy) <= max_turns
    assert row["prompt"] == world_row["prompt"][0]["content"]
    done = False
    for n, k in enumerate(policy):
        assert not done
        reply, reward, done = game.step(turns[k]["text"])
        assert turns[k]["reward"] == pytest.approx(reward)
        following = turns[k + 1 : policy[n + 1] if n + 1 < len(policy) else len(turns)]
        assert [t["text"] for t in following] == ([] if reply is None else [reply])
        assert all(t["role"] == "observation" for t in following)
    assert row["done"] == done == (row["stop"] == "done")
    assert row["stopped_max_turns"] == (not done and len(policy) == max_turns)
    assert row["reward"] == pytest.approx(sum(turns[k]["reward"] for k in policy))
    assert row["gold"] == float(trail.gold(game.world, _messages(row)))


def _messages(row: dict) -> list[dict]:
    out = list(row["prompt_messages"])
    for t in row["turns"]:
        role = "assistant" if t["role"] == "policy" else t["message_role"]
        out.append({"role": role, "content": t["text"]})
    return out


@pytest.mark.parametrize("backend", ["hf", "static"])
def test_trail_episodes_replay_the_game(tmp_path, backend):
    out = tmp_path / "trail.jsonl"
    summary = infer(
        out, "--env", "marlhf-trail-4", "--dataset", "marlhf-trail-4:6", "--num-samples", "5",
        "--batch-size", "2", "--max_turns", "3", "--env_config", '{"step_reward": 0.25}',
        "--temperature", "1.0", "--top_k", "0", "--env_timeout_s", "0",
        "--generation_backend", backend, "--save_token_ids",
    )  # fmt: skip
    rows = read_rows(str(out))
    assert summary["n"] == len(rows) == 5
    games = {r["id"]: r for r in trail.rows(4, 6, seed=0, split="valid")}  # the held-out games
    for row in rows:
        replay(row, games[row["prompt_id"]], 0.25, max_turns=3)
        for t in row["turns"]:
            if t["role"] == "policy":
                assert 1 <= t["tokens"] == len(t["token_ids"]) <= 8
    assert summary["turns_mean"] == pytest.approx(sum(r["num_turns"] for r in rows) / 5)
    assert summary["reward_mean"] == pytest.approx(sum(r["reward"] for r in rows) / 5)
    meta = json.loads(Path(f"{out}.meta.json").read_text())["settings"]
    assert meta["env"]["env"] == "marlhf-trail-4" and meta["env"]["max_turns"] == 3
    # marlhf view of the file: every policy turn's tokens, its last one ending a macro action
    shown = view_main([str(out), "--termination_condition", "fixed", "--ngram", "3", "-n", "0",
                       "--html", "none", "--color", "never"])[0]["items"]  # fmt: skip
    tok = AutoTokenizer.from_pretrained(resolve_model_path("tiny-base-trail"))
    for row, item in zip(rows, shown, strict=True):
        written = [t for t in row["turns"] if t["role"] == "policy"]
        cut = [t for t in item["turns"] if t["role"] == "policy"]
        assert len(cut) == len(written)
        for w, c in zip(written, cut, strict=True):
            assert "".join(c["pieces"]) == tok.decode(w["token_ids"])
            assert c["macro_end"][-1] and c["reward"] == w["reward"]


def _scripted_rows(tmp_path: Path) -> Path:
    plans = {
        "two": [{"obs": "hint {}", "reward": 0.5}, {"obs": "again", "reward": 0.25, "done": True}],
        "raises": [{"obs": "fine", "reward": 1.0}, {"raise": "boom in step"}],
        "bad_type": [{"return": {"observations": [], "reward": "high", "done": True}}],
        "endless": [{"obs": "more {}", "reward": 0.125}],
    }
    path = tmp_path / "rows.jsonl"
    with open(path, "w") as f:
        for name, plan in plans.items():
            row = {"id": name, "prompt": [{"role": "user", "content": f"play {name}"}]}
            f.write(json.dumps({**row, "plan": plan}) + "\n")
    return path


def test_environment_from_a_file_with_zero_reward_errors(tmp_path):
    out = tmp_path / "scripted.jsonl"
    summary = infer(
        out, "--env", f"{FAKES}:Scripted", "--dataset", str(_scripted_rows(tmp_path)),
        "--split", "train", "--num-samples", "0", "--max_turns", "3", "--env_errors",
        "zero_reward", "--batch-size", "4",
    )  # fmt: skip
    rows = {r["prompt_id"]: r for r in read_rows(str(out))}
    assert set(rows) == {"two", "raises", "bad_type", "endless"}

    def policy(row):
        return [t for t in row["turns"] if t["role"] == "policy"]

    two = rows["two"]
    assert [t["reward"] for t in policy(two)] == [0.5, 0.25]
    assert two["turns"][1] == {
        "role": "observation",
        "text": f"hint {two['turns'][0]['text']}",  # the environment saw the written text
        "message_role": "user",
    }
    assert (two["stop"], two["done"], two["reward"]) == ("done", True, 0.75)
    assert "env_error" not in two and two["env_metrics"]["steps"] == 2.0
    raises = rows["raises"]
    assert [t["reward"] for t in policy(raises)] == [1.0, 0.0]  # the failed turn gets 0
    assert raises["stop"] == "error" and raises["reward"] == 1.0
    assert (
        "Scripted: prompt row raises, turn 2: step raised RuntimeError: boom"
        in (raises["env_error"])
    )
    bad = rows["bad_type"]
    assert bad["num_turns"] == 1 and "returned reward 'high'" in bad["env_error"]
    endless = rows["endless"]
    assert (endless["num_turns"], endless["stop"], endless["stopped_max_turns"]) == (
        3,
        "max_turns",
        True,
    )
    assert [t["reward"] for t in policy(endless)] == [0.125, None, None]
    assert endless["reward"] == 0.125
    assert summary["env_errors"] == 2


def _selection_order(ids: list[str], seed: int = 1234) -> list[str]:
    return sorted(ids, key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())


def test_an_environment_error_is_one_line_and_earlier_batches_stay(tmp_path, capsys):
    out = tmp_path / "fail.jsonl"
    rows = _scripted_rows(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        infer(
            out, "--env", f"{FAKES}:Scripted", "--dataset", str(rows), "--split", "train",
            "--num-samples", "0", "--max_turns", "3", "--batch-size", "1",
        )  # fmt: skip
    assert exit_.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    order = _selection_order(["two", "raises", "bad_type", "endless"])
    first_bad = next(i for i in order if i in ("raises", "bad_type"))
    assert err[-1].startswith(f"error: --env Scripted: prompt row {first_bad}, turn ")
    assert "Traceback" not in "\n".join(err)
    kept = [r["prompt_id"] for r in read_rows(str(out))]
    assert kept == order[: order.index(first_bad)]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--env", "marlhf-trail-5"], "--env marlhf-trail-5: no environment registered with id"),
        (["--env", "no/such/file.py:Env"], "no such file"),
        (["--env", f"{FAKES}:Scriptd"], "has no Scriptd; did you mean Scripted"),
        (["--env", "marlhf-trail-4", "--dataset", "synthetic"], "--dataset synthetic: with --env"),
        (["--env", "marlhf-trail-4", "--apply_chat_template"], "--apply_chat_template with --env"),
    ],
)
def test_bad_environments_are_one_error_line(tmp_path, capsys, flags, message):
    out = tmp_path / "x.jsonl"
    args = ["--dataset", "marlhf-trail-4:2", *flags] if "--dataset" not in flags else flags
    with pytest.raises(SystemExit) as exit_:
        infer(out, *args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error: " in line]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in err
    assert not out.exists() or read_rows(str(out)) == []


def test_a_policy_without_a_chat_template_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([
            "--model_name_or_path", "tiny", *FAST, "--output", str(tmp_path / "x.jsonl"),
            "--env", "marlhf-trail-2", "--dataset", "marlhf-trail-2:2",
        ])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        err.startswith("error: --env marlhf-trail-2: the tokenizer of ") and "chat template" in err
    )


def test_reward_model_scores_the_whole_conversation(tmp_path):
    """``rm_reward`` is the reward model's value at the last action token of the conversation
    rendered at once with the chat template (the reference: the template's text up to the last
    action's eos, tokenised, read by the reward model)."""
    base = resolve_model_path("tiny-base-trail")
    tok = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(0)
    save_reward_model(RewardModel.from_pretrained(base), tok, tmp_path / "rm")
    out = tmp_path / "rm.jsonl"
    summary = infer(
        out, "--env", "marlhf-trail-2", "--dataset", "marlhf-trail-2:3", "--num-samples", "3",
        "--reward_model_name_or_path", str(tmp_path / "rm"), "--env_timeout_s", "0",
        "--top_k", "1", "--dtype", "fp32",
    )  # fmt: skip
    rm, _ = load_reward_model(str(tmp_path / "rm"), dtype=torch.float32, device="cpu")
    rm.eval()
    rows = read_rows(str(out))
    for row in rows:
        messages = _messages(row)
        last = max(k for k, m in enumerate(messages) if m["role"] == "assistant")
        text = tok.apply_chat_template(messages[: last + 1], tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        ids = ids[: len(ids) - ids[::-1].index(tok.eos_token_id)]  # up to the last action's eos
        with torch.no_grad():
            values = rm(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
        assert row["rm_reward"] == pytest.approx(float(values[0, -1]), abs=1e-4)
        assert row["reward"] == sum(t["reward"] for t in row["turns"] if t["role"] == "policy")
    assert summary["rm_reward_mean"] == pytest.approx(sum(r["rm_reward"] for r in rows) / 3)


def test_preflight_infer_checks_the_environment_and_its_rows(tmp_path, capsys):
    ok = [*TRAIL, "--env", "marlhf-trail-4", "--dataset", "marlhf-trail-4:2",
          "--max_total_seq_len", "128"]  # fmt: skip
    assert preflight_main(["infer", *ok]) == 0
    capsys.readouterr()
    missing = tmp_path / "none.jsonl"
    bad = [*TRAIL, "--env", "marlhf-trail-5", "--dataset", str(missing),
           "--max_total_seq_len", "100000"]  # fmt: skip
    assert preflight_main(["infer", *bad]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("preflight: --max_total_seq_len 100000 positions, more than")
    assert err[1].startswith("preflight: --env marlhf-trail-5: no environment registered")
    assert err[2] == f"preflight: --dataset {missing}: no such file"
