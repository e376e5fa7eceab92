"""What every generation backend must do, checked in the same way for each
(:mod:`marlhf.models.generation`): PPO's held-out evaluation and ``marlhf infer`` sampled through it.
The main suite runs these for the backends that need nothing beyond it
(``tests/models/test_generation.py``), ``tests/with_vllm/`` for vLLM.

The references are independent of the backend plumbing: each sampled row is scored again alone,
unpadded, by the reward model (the value at its last token), and a backend that seeds rows must
draw for each row alone, in a batch of one, what it drew for it in the batch.
"""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import torch

from marlhf.config import LoggingConfig
from marlhf.data.collate import PromptCollator
from marlhf.data.config import DataConfig
from marlhf.data.synthetic import gold_score
from marlhf.models.generation import SamplerSetup, get_backend, open_sampler
from marlhf.models.load import resolve_model_path
from marlhf.models.sequences import response_mask
from marlhf.runtime.rows import derive_row_seeds
from marlhf.stages.ppo.config import GenerationConfig, PPOConfig, PPOStageConfig, ppo_optim
from marlhf.stages.ppo.evaluation import EVAL_STREAM, evaluate_policy, load_eval_prompts
from marlhf.stages.ppo.rollout import eos_token_ids
from marlhf.stages.ppo.scoring import SequenceReward

MAX_NEW = 8


class Engine:
    """The parts of a DeepSpeed engine that generation and scoring use (one process, ZeRO 0)."""

    def __init__(self, module):
        self.module = module.eval()
        self.device = torch.device("cpu")

    def __call__(self, **kw):
        return self.module(**kw)

    def eval(self):
        self.module.eval()

    def train(self, mode=True):
        self.module.train(mode)

    def zero_optimization_stage(self):
        return 0


def end_score(rm, ids: list[int]) -> float:
    """The reward model's value at the last token of one unpadded sequence."""
    x = torch.tensor([ids])
    with torch.no_grad():
        return float(rm(x, torch.ones_like(x))[0, -1])


class Spy:
    """Wraps a sampler: records every call's prompts, seeds and raw responses."""

    def __init__(self, sampler):
        self.inner, self.calls = sampler, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def sample(self, prompt_ids, prompt_mask, cfg, eos_ids, pad_id, row_seeds=None):
        out = self.inner.sample(prompt_ids, prompt_mask, cfg, eos_ids, pad_id, row_seeds)
        self.calls.append((prompt_ids, prompt_mask, row_seeds, out[0]))
        return out


def evaluation_run(backend: str, cache) -> SimpleNamespace:
    """PPO's evaluation parts on ``tiny-base`` (its tokenizer, the actor, a reward model with a
    random head) sampling by ``backend``: 2 batches of 3 held-out synthetic prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from marlhf.models.reward_model import RewardModel

    path = resolve_model_path("tiny-base")
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    actor = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(0)
    rm = RewardModel.from_pretrained(path, init_std=0.05).eval()
    cfg = PPOStageConfig(
        generation=GenerationConfig(
            max_prompt_seq_len=160, max_answer_seq_len=MAX_NEW, temperature=1.0, top_k=20,
            top_p=0.95, generation_backend=backend, per_device_generation_batch_size=3,
        ),
        ppo=PPOConfig(optim=ppo_optim(seed=7)),
        data=DataConfig(data_output_path=str(cache)),
        log=LoggingConfig(eval_interval=1, eval_iters=2),
    )  # fmt: skip
    setup = SamplerSetup(model=actor, model_path=path, seed=7, max_rows=3)
    sampler = Spy(open_sampler(backend, cfg.generation, setup))
    eval_prompts = load_eval_prompts(cfg.data, cfg.generation, cfg.ppo.optim.seed, tok)
    return SimpleNamespace(
        ppo=cfg.ppo, generation=cfg.generation, perf=cfg.perf, log=cfg.log,
        tokenizer=tok, collate=PromptCollator(tok.pad_token_id),
        models=SimpleNamespace(actor=Engine(actor), reward=Engine(rm), sampler=sampler),
        eos_ids=eos_token_ids(tok, cfg.data), reward=SequenceReward(tok, cfg.ppo),
        gold=gold_score, eval_prompts=eval_prompts, rm=rm,
    )  # fmt: skip


def check_evaluation(backend: str, cache) -> None:
    """The held-out evaluation by ``backend``: its metrics are those of its responses scored
    again row by row; a second evaluation at the same step gives the same numbers; the global
    random state (the training's) is as it was; a seeding backend's rows are its rows alone."""
    run = evaluation_run(backend, cache)
    spy, rm, tok = run.models.sampler, run.rm, run.tokenizer
    rng = torch.get_rng_state()
    metrics = evaluate_policy(run, step=3)
    assert torch.equal(torch.get_rng_state(), rng)  # training draws as if nothing happened
    assert len(spy.calls) == 2  # --eval_iters 2 batches of 3
    lengths, scores, ends, golds = [], [], [], []
    for b, (ids, mask, seeds, raw) in enumerate(spy.calls):
        valid, eos = response_mask(raw, run.eos_ids)
        for r in range(ids.shape[0]):
            prompt = ids[r][mask[r].bool()].tolist()
            response = raw[r][valid[r]].tolist()
            assert 0 < len(response) <= MAX_NEW
            lengths.append(len(response))
            ends.append(float(eos[r]))
            scores.append(end_score(rm, prompt + response))
            text = run.eval_prompts[3 * b + r]["prompt"]
            golds.append(gold_score(text, tok.decode(response, skip_special_tokens=True)))
            if get_backend(backend).seeds_rows:  # the row alone draws what it drew in the batch
                want = derive_row_seeds(7, 3, torch.tensor([3 * b + r]), stream=EVAL_STREAM)
                assert torch.equal(seeds[r : r + 1], want)
                alone, _, _ = spy.inner.sample(
                    torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long),
                    run.generation, run.eos_ids, tok.pad_token_id, want,
                )  # fmt: skip
                assert alone[0][response_mask(alone, run.eos_ids)[0][0]].tolist() == response
    assert metrics["eval/response_len"] == statistics.fmean(lengths)
    assert metrics["eval/ends_with_eos"] == statistics.fmean(ends)
    assert abs(metrics["eval/score"] - statistics.fmean(scores)) < 1e-5
    assert abs(metrics["eval/gold"] - statistics.fmean(golds)) < 1e-9
    # the reward is the score clipped to --reward_clip (the small head stays inside it)
    assert max(abs(s) for s in scores) < run.ppo.reward_clip
    assert abs(metrics["eval/reward"] - metrics["eval/score"]) < 1e-5
    assert evaluate_policy(run, step=3) == metrics
    spy.close()


def check_inference(backend: str, assets, tmp_path) -> None:
    """``marlhf infer`` by ``backend`` on the inference tests' policy and reward model: every
    row's reward is the RM's score of its own tokens; the output's settings name the backend (all
    but ``hf``, the default); the same run again samples the same responses, and a
    seeding backend samples the same ones in batches of another size."""
    import json

    from marlhf.inference import read_rows, run_inference
    from marlhf.models.reward_model import load_reward_model
    from tests.support.inference import inference_args

    reward_model, _ = load_reward_model(assets["rm"], dtype=torch.float32)
    tok = assets["tok"]

    def run(name: str, **kw) -> list[dict]:
        out = str(tmp_path / f"{name}.jsonl")
        args = inference_args(
            assets, tmp_path, output=out, save_token_ids=True, max_new_tokens=MAX_NEW,
            generation_backend=backend, **kw,
        )  # fmt: skip
        summary = run_inference(args)
        assert summary["complete"]
        meta = json.loads(open(out + ".meta.json").read())["settings"]
        assert meta.get("generation_backend", "hf") == backend
        return read_rows(out)

    rows = run("a", batch_size=3)
    bos = [tok.bos_token_id]  # the tiny tokenizer adds it; prompts are cut to 64 from the left
    for r in rows:
        assert 0 < r["response_tokens"] == len(r["response_ids"]) <= MAX_NEW
        prompt = bos + tok(r["prompt"], add_special_tokens=False)["input_ids"][-(64 - 1) :]
        assert abs(r["reward"] - end_score(reward_model, prompt + r["response_ids"])) < 1e-4
    again = run("b", batch_size=3)
    assert [r["response_ids"] for r in again] == [r["response_ids"] for r in rows]
    if get_backend(backend).seeds_rows:
        other = {r["prompt_id"]: r["response_ids"] for r in run("c", batch_size=2)}
        assert all(other[r["prompt_id"]] == r["response_ids"] for r in rows)
