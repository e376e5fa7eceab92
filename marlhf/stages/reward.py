"""Stage 2: reward-model training on the preference split (40 % of each dataset with ``--data_split 2,4,4``).

A causal-LM backbone (hub id, local directory, ``tiny`` or the stage-1 output) plus a scalar value
head (:class:`marlhf.reward_model.RewardModel`) is trained with the Bradley–Terry loss on response
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
:func:`marlhf.reward_model.load_reward_model`, holding the end-score mean/std over the eval split
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
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from marlhf.batching import padded_eval_shard
from marlhf.bradley_terry import bt_loss, split_pair
from marlhf.checkpoint import gather_state_dict, write_json
from marlhf.cli import parse_config
from marlhf.config import DeepSpeedConfig, LoggingConfig, ModelConfig, OptimConfig
from marlhf.data.config import DataConfig
from marlhf.distributed import all_reduce_sum, barrier, is_main, rank, world_size
from marlhf.engine import build_eval_engine, build_train_engine, ds_config
from marlhf.finite import guarded_step
from marlhf.macro import MacroConfig, TerminationInputs, build_termination
from marlhf.model_context import check_context
from marlhf.models import TORCH_DTYPES, apply_lora, resolve_model_path
from marlhf.reward_model import RM_TYPES
from marlhf.stages.common import (
    StepPlan,
    check_resume,
    ensure_output_dir,
    plan_steps,
    run_stage,
    start,
    supervised_loop,
    to_device,
    write_run_config,
)

log = logging.getLogger("marlhf.reward")

NORMALIZER_SPLITS = ("train", "eval")


@dataclass
class RewardConfig:
    """Reward-model objective: end or segment score, Bradley–Terry options, normaliser fit."""

    rm_type: str = field(
        default="end",
        metadata={
            "help": "`end`: score = value at the last token; `segment` (Segment-PPO): score = mean "
            "of the values at the last token of each segment cut by --termination_condition.",
            "choices": RM_TYPES,
        },
    )
    use_margin: bool = field(
        default=False,
        metadata={
            "help": "Subtract the data's `margin` column from the score gap (rows without one: 0)."
        },
    )
    center_rewards_coef: float = field(
        default=0.0,
        metadata={"help": "Weight of the reward-centering penalty mean((r_c + r_r)^2) (0: off)."},
    )
    reference_model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Frozen SFT model whose entropies / log-probs the `entropy` / `ppl` rules read "
            "(segment RM only); default: --model_name_or_path."
        },
    )
    normalizer_split: str = field(
        default="train",
        metadata={
            "help": "Segment RM: split whose chosen responses fit the location-aware normaliser.",
            "choices": NORMALIZER_SPLITS,
        },
    )
    normalizer_max_samples: int = field(
        default=4096,
        metadata={
            "help": "Segment RM: at most this many chosen responses for the normaliser fit (0: all)."
        },
    )
    init_value_head: bool = field(
        default=False,
        metadata={
            "help": "Start from the value head saved with --model_name_or_path "
            "(value_head.safetensors, e.g. tiny-rm-base's, preference-pretrained) instead of a "
            "fresh one."
        },
    )
    num_padding_at_beginning: int = field(
        default=0,
        metadata={
            "help": "Accepted for compatibility with the original scripts and ignored: it skipped "
            "OPT's leading padding token; the end score here is read from the attention mask, "
            "which needs no such offset for any model."
        },
    )

    def __post_init__(self) -> None:
        if self.rm_type not in RM_TYPES:
            raise ValueError(f"--rm_type must be one of {RM_TYPES}, got {self.rm_type!r}")
        if not math.isfinite(self.center_rewards_coef) or self.center_rewards_coef < 0:
            raise ValueError(f"--center_rewards_coef must be >= 0, got {self.center_rewards_coef}")
        if self.normalizer_split not in NORMALIZER_SPLITS:
            raise ValueError(f"--normalizer_split must be one of {NORMALIZER_SPLITS}")
        if self.normalizer_max_samples < 0:
            raise ValueError(
                f"--normalizer_max_samples must be >= 0, got {self.normalizer_max_samples}"
            )
        if self.num_padding_at_beginning < 0:
            raise ValueError(
                f"--num_padding_at_beginning must be >= 0, got {self.num_padding_at_beginning}"
            )


@dataclass
class RewardStageConfig:
    """Stage 2: reward-model training (Bradley–Terry on end or segment scores)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    ds: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    log: LoggingConfig = field(default_factory=LoggingConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    macro: MacroConfig = field(default_factory=MacroConfig)


# --------------------------------------------------------------------------------------------------
# pair batches -> responses -> scores


@dataclass
class PairResponses:
    """The response part of each row of a stacked pair batch (chosen rows, then rejected rows).

    Fields:
        response_start: (2B,) long — position of response token 0 in the full sequence.
        response_ids: (2B, A) long — response tokens (end-of-conversation token included), pad after.
        action_mask: (2B, A) bool — response tokens, a prefix of each row.
        ends_with_eos: (2B,) bool — the response ends with the end-of-conversation token (not cut).
    """

    response_start: torch.Tensor
    response_ids: torch.Tensor
    action_mask: torch.Tensor
    ends_with_eos: torch.Tensor


def pair_responses(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: torch.Tensor,
    pad_id: int,
    eot_id: int,
) -> PairResponses:
    """Cut the responses out of a right-padded pair batch.

    Args:
        input_ids: (2B, T) long, right-padded; row i and row B + i share a prompt.
        attention_mask: (2B, T).
        prompt_len: (B,) long — where each pair's response starts (bos + prompt; see the collator).
        pad_id: filler for ``response_ids`` past each response.
        eot_id: last token id of the end-of-conversation token.

    >>> ids = torch.tensor([[2, 7, 8, 9, 1], [2, 7, 5, 1, 0]])  # bos=2, prompt 7, eot=1, pad=0
    >>> r = pair_responses(ids, (ids != 0).long(), torch.tensor([2]), pad_id=0, eot_id=1)
    >>> r.response_start.tolist(), r.response_ids.tolist(), r.action_mask.int().tolist()
    ([2, 2], [[8, 9, 1], [5, 1, 0]], [[1, 1, 1], [1, 1, 0]])
    >>> r.ends_with_eos.tolist()
    [True, True]
    """
    if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"pair_responses: input_ids {tuple(input_ids.shape)} and attention_mask "
            f"{tuple(attention_mask.shape)} must both be (2B, T)"
        )
    two_b, T = input_ids.shape
    start = prompt_len.to(input_ids.device).long().repeat(2)  # (2B,) chosen rows, then rejected
    if start.shape[0] != two_b:
        raise ValueError(
            f"pair_responses: prompt_len must be (B,) = ({two_b // 2},), got {tuple(prompt_len.shape)}"
        )
    length = attention_mask.long().sum(dim=1)  # right padding: valid tokens are 0..length-1
    n_resp = (length - start).clamp(min=0)  # (2B,)
    A = max(int(n_resp.max()), 1) if two_b else 1
    j = torch.arange(A, device=input_ids.device).unsqueeze(0)  # (1, A)
    action_mask = j < n_resp.unsqueeze(1)  # (2B, A)
    pos = (start.unsqueeze(1) + j).clamp(max=T - 1)
    response_ids = input_ids.gather(1, pos).masked_fill(~action_mask, pad_id)
    last = response_ids.gather(1, (n_resp - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    ends = (n_resp > 0) & (last == eot_id)
    return PairResponses(start, response_ids, action_mask, ends)


def response_scores(
    values: torch.Tensor,
    attention_mask: torch.Tensor,
    responses: PairResponses | None = None,
    macro_end: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores ``(2B,)`` of the rows of a pair batch, and the segment mask ``(2B, M)`` (segment RM).

    End RM (``macro_end`` None): the value at the last non-padding token. Segment RM: the mean of the
    values at the last token of each segment (``macro_end: (2B, A) bool`` over ``responses``).
    ``values: (2B, T) float``.
    """
    from marlhf.reward_model import end_scores
    from marlhf.reward_norm import segment_readout, segment_score

    if macro_end is None:
        return end_scores(values, attention_mask), None
    assert responses is not None
    rewards, seg_mask = segment_readout(
        values, responses.response_start, macro_end, responses.action_mask
    )
    return segment_score(rewards, seg_mask), seg_mask


# --------------------------------------------------------------------------------------------------
# the stage's moving parts


@dataclass
class Scorer:
    """Everything needed to score a collated pair batch with the engine: the termination rule and the
    frozen reference model of a segment RM (None for an end RM)."""

    cfg: RewardStageConfig
    pad_id: int
    eot_id: int
    rule: Any = None  # termination rule (segment RM)
    ref: Any = None  # frozen reference engine (entropy / ppl rules)

    @property
    def segment(self) -> bool:
        return self.rule is not None

    def margin(self, batch: dict) -> torch.Tensor | None:
        if not self.cfg.reward.use_margin:
            return None
        m = batch["margin"]
        return torch.nan_to_num(m, nan=0.0)

    @torch.no_grad()
    def macro_end(self, batch: dict, responses: PairResponses, generator: torch.Generator | None):
        """(2B, A) bool ends of the segments of every row."""
        ref_logprobs = ref_entropy = None
        if self.rule.needs & {"ref_logprobs", "ref_entropy"}:
            from marlhf.rl.rollout import response_logprobs_and_entropy

            logits = self.ref(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                use_cache=False,
            ).logits
            ref_logprobs, ref_entropy = response_logprobs_and_entropy(
                logits,
                batch["input_ids"],
                responses.response_start,
                responses.response_ids.shape[1],
                with_entropy="ref_entropy" in self.rule.needs,
            )
        out = self.rule(
            TerminationInputs(
                response_ids=responses.response_ids,
                action_mask=responses.action_mask,
                ends_with_eos=responses.ends_with_eos,
                ref_logprobs=ref_logprobs,
                ref_entropy=ref_entropy,
                generator=generator,
            )
        )
        return out.macro_end

    def scores(self, engine, batch: dict, generator: torch.Generator | None = None):
        """``(scores (2B,), end scores (2B,), segment mask (2B, M) | None)`` of a device batch."""
        from marlhf.reward_model import end_scores

        values = engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        if not self.segment:
            s = end_scores(values, batch["attention_mask"])
            return s, s, None
        responses = pair_responses(
            batch["input_ids"],
            batch["attention_mask"],
            batch["prompt_len"],
            self.pad_id,
            self.eot_id,
        )
        macro_end = self.macro_end(batch, responses, generator)
        s, seg_mask = response_scores(values, batch["attention_mask"], responses, macro_end)
        return s, end_scores(values, batch["attention_mask"]).detach(), seg_mask


def _shard(n: int, batch: int, max_batches: int = 0) -> list[tuple[list[int], bool]]:
    """This rank's evaluation batches as ``(indices, real)``, as many on every rank (ZeRO-3's
    collective parameter gathers stay in step; see ``padded_eval_shard``)."""
    return padded_eval_shard(n, batch, world_size(), rank(), max_batches)


# Sums accumulated over evaluation batches, all-reduced as one float64 vector.
_SUMS = ("pairs", "loss", "wins", "chosen", "rejected", "score_sq", "end", "end_sq")


@torch.no_grad()
def evaluate(
    engine, dataset, collate, scorer: Scorer, max_batches: int
) -> tuple[dict[str, float], Any]:
    """Pairwise metrics over the eval split (all ranks) and the end-score statistics.

    Returns ``({"eval/accuracy", "eval/chosen_mean", "eval/rejected_mean", "eval/score_std",
    "eval/loss"}, ScoreStats of the end scores of all 2N responses)``. Accuracy counts a tie as half.
    """
    from marlhf.reward_norm import ScoreStats

    cfg = scorer.cfg
    engine.eval()
    acc = torch.zeros(len(_SUMS), dtype=torch.float64)
    gen = torch.Generator().manual_seed(
        cfg.optim.seed
    )  # the `randomized` rule: the same cuts every eval
    for idx, real in _shard(len(dataset), cfg.optim.per_device_eval_batch_size, max_batches):
        batch = to_device(collate([dataset[i] for i in idx]), engine.device)
        scores, ends, _ = scorer.scores(engine, batch, gen)
        if not real:
            continue
        chosen, rejected = split_pair(scores.float())
        n = chosen.shape[0]
        loss = bt_loss(chosen, rejected, scorer.margin(batch), cfg.reward.center_rewards_coef)
        wins = (chosen > rejected).double() + 0.5 * (chosen == rejected).double()
        e = ends.double()
        acc += torch.stack(
            [
                torch.tensor(float(n), dtype=torch.float64),
                loss.double().cpu() * n,
                wins.sum().cpu(),
                chosen.double().sum().cpu(),
                rejected.double().sum().cpu(),
                scores.double().pow(2).sum().cpu(),
                e.sum().cpu(),
                e.pow(2).sum().cpu(),
            ]
        )
    engine.train()
    s = dict(zip(_SUMS, all_reduce_sum(acc).tolist(), strict=True))
    n = max(s["pairs"], 1.0)
    mean = (s["chosen"] + s["rejected"]) / (2 * n)
    end_mean = s["end"] / (2 * n)
    metrics = {
        "eval/accuracy": s["wins"] / n,
        "eval/chosen_mean": s["chosen"] / n,
        "eval/rejected_mean": s["rejected"] / n,
        "eval/score_std": math.sqrt(max(s["score_sq"] / (2 * n) - mean**2, 0.0)),
        "eval/loss": s["loss"] / n,
    }
    stats = ScoreStats(mean=end_mean, std=math.sqrt(max(s["end_sq"] / (2 * n) - end_mean**2, 0.0)))
    return metrics, stats


def _gather_cat(x: torch.Tensor) -> torch.Tensor:
    """Concatenate a 1-d CPU tensor of any length over ranks (rank order)."""
    if world_size() == 1:
        return x
    parts: list = [None] * world_size()
    torch.distributed.all_gather_object(parts, x.cpu())
    return torch.cat(parts)


@torch.no_grad()
def fit_normalizer(engine, dataset, collate, scorer: Scorer):
    """Location-aware normaliser fitted over the segment rewards of chosen responses (all ranks).

    Uses the first ``--normalizer_max_samples`` pairs of ``dataset`` (all with 0).
    """
    from marlhf.reward_norm import fit_location_normalizer, segment_positions, segment_readout

    cfg = scorer.cfg
    n = len(dataset)
    if cfg.reward.normalizer_max_samples:
        n = min(n, cfg.reward.normalizer_max_samples)
    engine.eval()
    rewards, positions = [], []
    gen = torch.Generator().manual_seed(cfg.optim.seed)
    for idx, real in _shard(n, cfg.optim.per_device_eval_batch_size):
        batch = to_device(collate([dataset[i] for i in idx]), engine.device)
        values = engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        responses = pair_responses(
            batch["input_ids"],
            batch["attention_mask"],
            batch["prompt_len"],
            scorer.pad_id,
            scorer.eot_id,
        )
        macro_end = scorer.macro_end(batch, responses, gen)
        r, mask = segment_readout(
            values, responses.response_start, macro_end, responses.action_mask
        )
        if not real:
            continue
        half = r.shape[0] // 2  # chosen rows only
        r, mask = r[:half], mask[:half]
        rewards.append(r[mask].float().cpu())
        positions.append(segment_positions(mask)[mask].float().cpu())
    engine.train()
    r = _gather_cat(torch.cat(rewards) if rewards else torch.zeros(0))
    p = _gather_cat(torch.cat(positions) if positions else torch.zeros(0))
    return fit_location_normalizer(r, p)


def build_reward_model(cfg: RewardStageConfig):
    """A fresh value head on the backbone of ``--model_name_or_path`` (dropout, checkpointing, LoRA)."""
    from transformers import AutoConfig

    from marlhf.models import set_dropout_config
    from marlhf.reward_model import RewardModel

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
    if m.lora_dim:
        model.backbone = apply_lora(model.backbone, m)
        if m.gradient_checkpointing and m.only_optimize_lora:
            model.enable_input_require_grads()
    return model


def load_value_head(model, path: str) -> None:
    """Copy ``path``/value_head.safetensors (``{"weight": (1, hidden)}``) into ``model.v_head``."""
    from safetensors.torch import load_file

    from marlhf.reward_model import VALUE_HEAD_FILE

    file = Path(path) / VALUE_HEAD_FILE
    if not file.is_file():
        raise FileNotFoundError(
            f"--init_value_head: {file} does not exist; --model_name_or_path must be a reward model "
            "or a base shipped with its value head (tiny-rm-base), or drop --init_value_head"
        )
    weight = load_file(file).get("weight")
    if weight is None or tuple(weight.shape) != tuple(model.v_head.weight.shape):
        raise ValueError(
            f"--init_value_head: {file} must hold 'weight' of shape "
            f"{tuple(model.v_head.weight.shape)}, got {None if weight is None else tuple(weight.shape)}"
        )
    with torch.no_grad():
        model.v_head.weight.copy_(weight.to(model.v_head.weight.dtype))


def save_reward_checkpoint(
    module: torch.nn.Module,
    tokenizer,
    path: str | Path,
    *,
    zero_stage: int,
    rm_type: str,
    run_config: dict,
    ds_config: dict,
    score_stats=None,
    normalizer=None,
    termination=None,
    extra: dict | None = None,
) -> None:
    """Save a (possibly LoRA-wrapped, possibly ZeRO-3-partitioned) :class:`RewardModel` as one
    reward-model directory that :func:`marlhf.reward_model.load_reward_model` reads; LoRA weights are
    merged into the backbone. Collective under ZeRO-3 (every rank calls it); rank 0 writes."""
    from marlhf.models import merge_lora_state_dict, unwrap_peft
    from marlhf.reward_model import save_reward_model_state

    _, scaling = unwrap_peft(module.backbone)
    state = gather_state_dict(module, zero_stage)
    if is_main():
        assert state is not None
        if scaling is not None:
            state = merge_lora_state_dict(state, scaling)
        save_reward_model_state(
            state,
            module.config,
            tokenizer,
            path,
            rm_type=rm_type,
            score_stats=score_stats,
            normalizer=normalizer,
            termination=termination,
            extra=extra,
        )
        write_json(Path(path) / "run_config.json", run_config)
        write_json(Path(path) / "ds_config.json", ds_config)
    barrier()


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
    from marlhf.data.tokenize import eot_ids
    from marlhf.models import load_causal_lm

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
    """What one reward-model run's steps, evaluations and saves share (built by :func:`_setup`).
    ``last_eval`` is ``(metrics, end-score statistics)`` of the latest evaluation; it travels with
    the training state, so a resumed run saves the statistics the uninterrupted one would."""

    cfg: RewardStageConfig
    tokenizer: Any
    train_ds: Any
    eval_ds: Any
    collate: Any
    plan: StepPlan
    scorer: Scorer
    engine: Any
    ds_json: dict
    run_config: dict
    last_eval: tuple[dict, Any] | None = None
    settings: dict | None = None  # the run's settings, saved with each training state


def _setup(cfg: RewardStageConfig) -> _RMRun:
    """Process group, data, step plan, scorer, engine and run config of a reward-model run."""
    from marlhf.data.collate import PairCollator
    from marlhf.data.tokenize import build_pair_dataset
    from marlhf.models import load_tokenizer

    start(cfg.ds, cfg.optim.seed)
    out = ensure_output_dir(cfg.log.output_dir)
    tokenizer = load_tokenizer(cfg.model, padding_side="right")
    check_context(
        {
            "--model_name_or_path": cfg.model.model_name_or_path,
            "--reference_model_name_or_path": cfg.reward.reference_model_name_or_path or "",
        },
        {"--max_seq_len": cfg.data.max_seq_len},
    )
    train_ds = build_pair_dataset(cfg.data, tokenizer, "train", cfg.optim.seed)
    eval_ds = build_pair_dataset(cfg.data, tokenizer, "eval", cfg.optim.seed)
    if len(eval_ds) == 0:
        raise ValueError(
            f"--data_path {list(cfg.data.data_path)}: the reward-model eval split is empty"
        )
    _check_margins(train_ds, cfg)
    plan = plan_steps(len(train_ds), cfg.optim, "reward-model split", "pairs")
    settings = check_resume(cfg, cfg.log, {"global_batch": plan.global_batch})
    scorer = _build_scorer(cfg, tokenizer)
    engine, ds_json = build_train_engine(
        build_reward_model(cfg),
        model_cfg=cfg.model,
        ds=cfg.ds,
        optim=cfg.optim,
        total_steps=plan.total,
        micro_batch_size=plan.micro,
    )
    run_config = write_run_config(out, cfg, ds_json)
    if is_main():
        log.info(
            "RM (%s): %d train / %d eval pairs, %d steps/epoch, %d steps",
            cfg.reward.rm_type,
            len(train_ds),
            len(eval_ds),
            plan.steps_per_epoch,
            plan.total,
        )
    collate = PairCollator(tokenizer.pad_token_id)
    return _RMRun(
        cfg, tokenizer, train_ds, eval_ds, collate, plan, scorer, engine, ds_json, run_config,
        settings=settings,
    )  # fmt: skip


def _train_step(run: _RMRun, micro_batch_indices: list[list[int]], step: int) -> dict[str, float]:
    """One optimizer step: the Bradley–Terry loss, mean over the global batch's pairs."""
    cfg, engine, scorer, plan = run.cfg, run.engine, run.scorer, run.plan
    pairs_per_step = plan.global_batch
    # the `randomized` rule cuts by step, so a resumed run cuts exactly as the uninterrupted one
    gen = torch.Generator().manual_seed(cfg.optim.seed * 1_000_003 + step)
    sums = torch.zeros(5, dtype=torch.float64)  # loss, wins, margin, segments, segment tokens
    for idx in micro_batch_indices:
        batch = to_device(run.collate([run.train_ds[i] for i in idx]), engine.device)
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
    run.last_eval = evaluate(
        run.engine, run.eval_ds, run.collate, run.scorer, run.cfg.log.eval_iters
    )
    return run.last_eval[0]


def _save_model(run: _RMRun, step: int, path: Path, final: bool) -> None:
    """One reward-model directory. An intermediate one holds the end-score statistics of the latest
    evaluation; the final one those over the WHOLE eval split (for PPO's reward normalisation) and,
    for a segment RM, the location-aware normaliser."""
    cfg, scorer = run.cfg, run.scorer
    normalizer, extra = None, {"global_step": step}
    if final:
        if run.last_eval is None or cfg.log.eval_iters:
            run.last_eval = evaluate(run.engine, run.eval_ds, run.collate, scorer, 0)
        extra["eval_accuracy"] = run.last_eval[0]["eval/accuracy"]
        if scorer.segment:
            norm_ds = run.train_ds if cfg.reward.normalizer_split == "train" else run.eval_ds
            normalizer = fit_normalizer(run.engine, norm_ds, run.collate, scorer)
            if is_main():
                log.info("location normaliser: %s", normalizer)
    save_reward_checkpoint(
        run.engine.module,
        run.tokenizer,
        path,
        zero_stage=cfg.ds.zero_stage,
        rm_type=cfg.reward.rm_type,
        run_config=run.run_config,
        ds_config=run.ds_json,
        score_stats=run.last_eval[1] if run.last_eval else None,
        normalizer=normalizer,
        termination=cfg.macro if scorer.segment else None,
        extra=extra,
    )


def _stage_state(run: _RMRun) -> dict:
    """The latest evaluation, as plain data for the training state."""
    if run.last_eval is None:
        return {"last_eval": None}
    metrics, stats = run.last_eval
    return {"last_eval": {"metrics": dict(metrics), "score_stats": [stats.mean, stats.std]}}


def _load_stage_state(run: _RMRun, state: dict) -> None:
    from marlhf.reward_norm import ScoreStats

    saved = state.get("last_eval")
    if saved is not None:
        mean, std = saved["score_stats"]
        run.last_eval = (dict(saved["metrics"]), ScoreStats(mean=mean, std=std))


def train(cfg: RewardStageConfig) -> Path:
    run = _setup(cfg)
    supervised_loop(
        run.engine,
        run.plan,
        cfg.log,
        n_train=len(run.train_ds),
        seed=cfg.optim.seed,
        desc="rm",
        logger=log,
        train_step=functools.partial(_train_step, run),
        evaluate=functools.partial(_run_eval, run),
        save_model=functools.partial(_save_model, run),
        stage_state=functools.partial(_stage_state, run),
        load_stage_state=functools.partial(_load_stage_state, run),
        settings=run.settings,
    )
    out = Path(cfg.log.output_dir)
    if is_main():
        assert run.last_eval is not None  # the final save evaluated
        log.info(
            "reward model saved to %s (score mean %.4f, std %.4f)",
            out,
            run.last_eval[1].mean,
            run.last_eval[1].std,
        )
    return out


def pair_tokens(batch: dict) -> torch.Tensor:
    """Number of response tokens in a collated pair batch (both halves)."""
    length = batch["attention_mask"].long().sum(dim=1)
    return (length - batch["prompt_len"].to(length.device).repeat(2)).clamp(min=0).sum()


def main(argv: list[str] | None = None) -> None:
    run_stage(train, parse_config(RewardStageConfig, argv))


if __name__ == "__main__":
    main()
