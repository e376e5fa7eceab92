"""Stage 2: reward-model training on the preference split (40 % of each dataset with ``--data_split 2,4,4``).

A causal-LM backbone (hub id, local directory, ``tiny`` or the stage-1 output) plus a scalar value
head (:class:`marlhf.models.reward_model.RewardModel`) is trained with the Bradley–Terry loss on response
scores; the B chosen and B rejected rows of a batch go through the model as one ``(2B, T)`` batch.

- ``--rm_type end`` (default): the score is the value at the last non-padding token of
  prompt + response + end-of-conversation token.
- ``--rm_type segment`` (Segment-PPO, Yin et al. 2025): the response is cut into segments by the
  macro-action rule (``--termination_condition``, ``--ngram``, ...); the score is the mean of the
  values read at each segment's last token. The ``entropy`` and ``ppl`` rules read the frozen SFT
  model's entropies / log-probs (``--reference_model_name_or_path``, default the starting model).
  At the end the location-aware normaliser is fitted over chosen responses and saved with the model.

Options: ``--use_margin`` subtracts the data's margin column from the score gap (Llama-2 style);
``--center_rewards_coef`` adds the reward-centering penalty. The loss is normalised over the
global batch (micro × accumulation × ranks pairs), so the update does not depend on its split.

Output: ``output_dir`` is ONE reward-model directory that stage 3 and the inference script load with
:func:`marlhf.models.reward_model.load_reward_model`, holding the end-score mean/std over the eval split
(``score_stats``), and for a segment RM the fitted ``normalizer`` and the ``termination`` settings;
``run_config.json`` and ``ds_config.json`` sit next to it. Intermediate models go to
``output_dir/checkpoints/step-N/`` (``--save_steps``), resumable state to ``output_dir/train_state/``.
Run::

    python -m marlhf.stages.reward --model_name_or_path out/sft --output_dir out/rm

Shapes: ``B`` pairs, ``T`` full sequence, ``A`` response tokens, ``M`` segments.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from marlhf.algo.bradley_terry import bt_loss, split_pair
from marlhf.cli import parse_config
from marlhf.config import ModelConfig
from marlhf.data.collate import PairCollator
from marlhf.data.tokenize import build_pair_dataset, eot_ids
from marlhf.macro import build_termination
from marlhf.models.load import (
    TORCH_DTYPES,
    load_causal_lm,
    resolve_model_path,
    set_dropout_config,
)
from marlhf.models.lora import log_parameter_counts, wrap_lora
from marlhf.models.packing import packing_mode
from marlhf.models.reward_model import RewardModel, RewardModelInfo, load_value_head
from marlhf.models.save import save_reward_checkpoint
from marlhf.rewards.segment import ScoreStats
from marlhf.runtime.distributed import all_reduce_sum, is_main
from marlhf.runtime.engine import build_eval_engine, ds_config
from marlhf.runtime.finite import guarded_step
from marlhf.runtime.micro_batches import accumulate, regroup
from marlhf.stages.common import SupervisedSetup, run_stage, setup_supervised, to_device
from marlhf.stages.exits import run_program
from marlhf.stages.reward.config import RewardStageConfig
from marlhf.stages.reward.evaluate import evaluate, fit_normalizer
from marlhf.stages.reward.scorer import Scorer

log = logging.getLogger("marlhf.reward")

# --------------------------------------------------------------------------------------------------
# the stage's moving parts


def build_reward_model(cfg: RewardStageConfig):
    """A fresh value head on the backbone of ``--model_name_or_path`` (dropout, checkpointing, LoRA)."""
    from transformers import AutoConfig

    m = cfg.model
    path = resolve_model_path(m.model_name_or_path)
    hf_config = AutoConfig.from_pretrained(path, trust_remote_code=m.trust_remote_code)
    if m.dropout is not None:
        set_dropout_config(hf_config, m.dropout)
    keep = None
    if cfg.ds.zero_stage == 3:
        # Load the backbone partitioned across ranks (the config object must outlive from_pretrained).
        from transformers.integrations import HfDeepSpeedConfig

        zero3 = ds_config(
            zero_stage=3,
            dtype=m.dtype,
            micro_batch_size=cfg.optim.per_device_train_batch_size,
            learning_rate=cfg.optim.learning_rate,
        )
        keep = HfDeepSpeedConfig(zero3)  # noqa: F841
    model = RewardModel.from_pretrained(
        path, dtype=TORCH_DTYPES[m.dtype], config=hf_config, trust_remote_code=m.trust_remote_code
    )
    del keep
    if cfg.reward.init_value_head:
        load_value_head(model, path)
    if m.gradient_checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    model.backbone, lora = wrap_lora(model.backbone, m)
    if m.gradient_checkpointing and not m.trains_base:
        model.enable_input_require_grads()
    log_parameter_counts(model, f"reward model (value head included){lora}")
    return model


# --------------------------------------------------------------------------------------------------
# training


def _check_margins(dataset, cfg: RewardStageConfig) -> None:
    if not cfg.reward.use_margin:
        return
    margins = torch.tensor(list(dataset["margin"]), dtype=torch.float32)
    if margins.numel() and bool(torch.isnan(margins).all()):
        raise ValueError(
            f"--use_margin: no example of {list(cfg.data.data_path)} has a `margin` value; "
            "drop the flag or use data with a margin column"
        )


def _build_scorer(cfg: RewardStageConfig, tokenizer) -> Scorer:
    scorer = Scorer(cfg, tokenizer.pad_token_id, eot_ids(cfg.data, tokenizer)[-1])
    if cfg.reward.rm_type != "segment":
        return scorer
    scorer.rule = build_termination(cfg.macro, tokenizer)
    if scorer.rule.needs & {"ref_logprobs", "ref_entropy"}:
        ref_path = cfg.reward.reference_model_name_or_path or cfg.model.model_name_or_path
        ref_cfg = ModelConfig(
            model_name_or_path=ref_path,
            trust_remote_code=cfg.model.trust_remote_code,
            dtype=cfg.model.dtype,
            dropout=0.0,
        )
        zero3 = None
        if cfg.ds.zero_stage == 3:
            zero3 = ds_config(
                zero_stage=3, dtype=cfg.model.dtype, micro_batch_size=1, inference=True
            )
        ref = load_causal_lm(ref_cfg, ds_zero3_config=zero3)
        scorer.ref, _ = build_eval_engine(
            ref, dtype=cfg.model.dtype, zero_stage=cfg.ds.zero_stage, offload=cfg.ds.offload
        )
        log.info(
            "segment RM: %s rule reads reference model %s",
            cfg.macro.termination_condition,
            ref_path,
        )
    return scorer


@dataclass
class _RMRun:
    """What one reward-model run's steps, evaluations and saves share (built by :func:`_setup`):
    the shared set-up and the scorer. ``last_eval`` is ``(metrics, end-score statistics)`` of the
    latest evaluation; it travels with the training state, so a resumed run saves the statistics
    the uninterrupted one would."""

    setup: SupervisedSetup
    scorer: Scorer
    collate: PairCollator
    last_eval: tuple[dict, Any] | None = None

    @property
    def cfg(self) -> RewardStageConfig:
        return self.setup.cfg


def _check_data(cfg: RewardStageConfig, train_ds, eval_ds) -> None:
    if len(eval_ds) == 0:
        raise ValueError(
            f"--data_path {list(cfg.data.data_path)}: the reward-model eval split is empty"
        )
    _check_margins(train_ds, cfg)


def _setup(cfg: RewardStageConfig) -> _RMRun:
    """The shared set-up (:func:`marlhf.stages.common.setup_supervised`) with the pair data and
    the value-head model, then the scorer (for a segment RM, its rule and reference model)."""
    setup = setup_supervised(
        cfg,
        name=f"RM ({cfg.reward.rm_type})",
        logger=log,
        models={
            "--model_name_or_path": cfg.model.model_name_or_path,
            "--reference_model_name_or_path": cfg.reward.reference_model_name_or_path or "",
        },
        build_dataset=build_pair_dataset,
        check_data=functools.partial(_check_data, cfg),
        split="reward-model split",
        unit="pairs",
        build_model=functools.partial(build_reward_model, cfg),
    )
    scorer = _build_scorer(cfg, setup.tokenizer)
    return _RMRun(setup, scorer, PairCollator(setup.tokenizer.pad_token_id))


def _train_step(run: _RMRun, micro_batch_indices: list[list[int]], step: int) -> dict[str, float]:
    """One optimizer step: the Bradley–Terry loss, mean over the global batch's pairs."""
    cfg, engine, scorer, plan = run.cfg, run.setup.engine, run.scorer, run.setup.plan
    pairs_per_step = plan.global_batch
    # the `randomized` rule cuts by step, so a resumed run cuts exactly as the uninterrupted one
    gen = torch.Generator().manual_seed(cfg.optim.seed * 1_000_003 + step)
    sums = torch.zeros(5, dtype=torch.float64)  # loss, wins, margin, segments, segment tokens
    rows = {i: run.setup.train_ds[i] for idx in micro_batch_indices for i in idx}
    budget = cfg.batching.max_tokens_per_micro_batch
    packed = cfg.batching.packing and packing_mode(engine) is not None
    micro_batch_indices = regroup(  # --max_tokens_per_micro_batch: pairs by their tokens
        micro_batch_indices, lambda i: _pair_length(rows[i], packed), budget, packed=packed
    )
    for idx in accumulate(engine, micro_batch_indices, explicit=budget > 0):
        batch = to_device(run.collate([rows[i] for i in idx]), engine.device)
        scores, _, seg_mask = scorer.scores(engine, batch, gen)
        chosen, rejected = split_pair(scores)
        n = chosen.shape[0]
        loss = bt_loss(chosen, rejected, scorer.margin(batch), cfg.reward.center_rewards_coef)
        # bt_loss is a mean over this micro-batch's n pairs; rescale to a share of the global
        # batch's mean (× world: DeepSpeed averages gradients over ranks).
        engine.backward(loss * (n * plan.world / pairs_per_step), scale_wrt_gas=False)
        guarded_step(engine, step + 1, "reward model", loss)
        with torch.no_grad():
            c, r = chosen.detach().double(), rejected.detach().double()
            n_seg = float(seg_mask.sum()) if seg_mask is not None else 0.0
            n_tok = float(pair_tokens(batch)) if seg_mask is not None else 0.0
            sums += torch.tensor(
                [
                    float(loss.detach()) * n,
                    float(((c > r).double() + 0.5 * (c == r).double()).sum()),
                    float((c - r).sum()),
                    n_seg,
                    n_tok,
                ],
                dtype=torch.float64,
            )
    sums = all_reduce_sum(sums)
    metrics = {
        "train/loss": float(sums[0] / pairs_per_step),
        "train/accuracy": float(sums[1] / pairs_per_step),
        "train/margin_mean": float(sums[2] / pairs_per_step),
    }
    if scorer.segment:
        metrics["macro/segments_mean"] = float(sums[3] / (2 * pairs_per_step))
        metrics["macro/mean_len"] = float(sums[4] / sums[3].clamp(min=1))
    return metrics


def _run_eval(run: _RMRun) -> dict[str, float]:
    """An evaluation (``--eval_iters`` batches); remembered as ``run.last_eval``."""
    s = run.setup
    run.last_eval = evaluate(s.engine, s.eval_ds, run.collate, run.scorer, run.cfg.log.eval_iters)
    return run.last_eval[0]


def _save_model(run: _RMRun, step: int, path: Path, final: bool) -> None:
    """One reward-model directory. An intermediate one holds the end-score statistics of the latest
    evaluation; the final one those over the WHOLE eval split (for PPO's reward normalisation) and,
    for a segment RM, the location-aware normaliser."""
    cfg, scorer, s = run.cfg, run.scorer, run.setup
    normalizer, extra = None, {"global_step": step}
    if final:
        if run.last_eval is None or cfg.log.eval_iters:
            run.last_eval = evaluate(s.engine, s.eval_ds, run.collate, scorer, 0)
        extra["eval_accuracy"] = run.last_eval[0]["eval/accuracy"]
        if scorer.segment:
            norm_ds = s.train_ds if cfg.reward.normalizer_split == "train" else s.eval_ds
            normalizer = fit_normalizer(s.engine, norm_ds, run.collate, scorer)
            if is_main():
                log.info("location normaliser: %s", normalizer)
    info = RewardModelInfo(
        rm_type=cfg.reward.rm_type,
        score_stats=run.last_eval[1] if run.last_eval else None,
        normalizer=normalizer,
        termination=cfg.macro if scorer.segment else None,
        extra=extra,
    )
    save_reward_checkpoint(
        s.engine.module, s.tokenizer, path, zero_stage=cfg.ds.zero_stage, info=info,
        run_config=s.run_config, ds_config=s.ds_json,
    )  # fmt: skip


def _stage_state(run: _RMRun) -> dict:
    """The latest evaluation, as plain data for the training state."""
    if run.last_eval is None:
        return {"last_eval": None}
    metrics, stats = run.last_eval
    return {"last_eval": {"metrics": dict(metrics), "score_stats": [stats.mean, stats.std]}}


def _load_stage_state(run: _RMRun, state: dict) -> None:
    saved = state.get("last_eval")
    if saved is not None:
        mean, std = saved["score_stats"]
        run.last_eval = (dict(saved["metrics"]), ScoreStats(mean=mean, std=std))


def train(cfg: RewardStageConfig) -> Path:
    run = _setup(cfg)
    run.setup.loop(
        desc="rm",
        train_step=functools.partial(_train_step, run),
        evaluate=functools.partial(_run_eval, run),
        save_model=functools.partial(_save_model, run),
        stage_state=functools.partial(_stage_state, run),
        load_stage_state=functools.partial(_load_stage_state, run),
    )
    if is_main():
        assert run.last_eval is not None  # the final save evaluated
        log.info(
            "reward model saved to %s (score mean %.4f, std %.4f)",
            run.setup.out,
            run.last_eval[1].mean,
            run.last_eval[1].std,
        )
    return run.setup.out


def _pair_length(row: dict, packed: bool) -> int:
    """The positions a pair takes in a micro-batch: its two rows' tokens when packed, else twice
    the longer (the collator pads both to the batch's longest row)."""
    chosen, rejected = len(row["chosen_input_ids"]), len(row["rejected_input_ids"])
    return chosen + rejected if packed else 2 * max(chosen, rejected)


def pair_tokens(batch: dict) -> torch.Tensor:
    """Number of response tokens in a collated pair batch (both halves)."""
    length = batch["attention_mask"].long().sum(dim=1)
    return (length - batch["prompt_len"].to(length.device).repeat(2)).clamp(min=0).sum()


def main(argv: list[str] | None = None) -> None:
    run_stage(train, parse_config(RewardStageConfig, argv))


if __name__ == "__main__":
    run_program(main)
