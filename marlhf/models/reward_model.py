"""Reward model (and PPO critic): a causal LM's base transformer plus a scalar value head.

``RewardModel`` maps every position of a sequence to a scalar, ``values: (B, T)``. An *end* reward
model scores a response by the value at its last token (:func:`end_scores`); a *segment* reward model
(Segment-PPO) reads the value at the last token of every macro action and averages them
(:mod:`marlhf.rewards.segment`). The PPO critic is the same class, initialised from the trained RM.

A saved reward model is ONE directory that later stages load directly with :func:`load_reward_model`:

- ``config.json`` + ``model.safetensors``: the backbone in standard Hugging Face format (loads with
  ``transformers.AutoModel.from_pretrained``);
- tokenizer files;
- ``value_head.safetensors``: ``{"weight": (1, hidden)}``;
- ``reward_config.json``: what a :class:`RewardModelInfo` holds, ``rm_type`` ("end" | "segment"),
  eval ``score_stats`` (mean/std), the fitted location ``normalizer`` (segment RMs), the
  ``termination`` settings used to cut segments (segment RMs) and the caller's ``extra`` keys (at
  the top level), with the ``format_version``, ``backbone_class`` and ``hidden_size`` of the save.

Shapes: ``B`` batch, ``T`` full sequence.

>>> import torch
>>> mask = torch.tensor([[1, 1, 1, 0, 0],   # right-padded
...                      [1, 1, 1, 1, 1]])  # truncated: no padding
>>> end_score_index(mask).tolist()
[2, 4]
>>> values = torch.arange(10.0).reshape(2, 5)
>>> end_scores(values, mask).tolist()
[2.0, 9.0]
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from marlhf.models.config import RM_TYPES
from marlhf.models.packing import pack_rows, packed_inputs, packing_mode, packs
from marlhf.rewards.segment import (
    LocationNormalizer,
    ScoreStats,
)
from marlhf.runtime.checkpoint_files import naming_write_errors

VALUE_HEAD_FILE = "value_head.safetensors"
REWARD_CONFIG_FILE = "reward_config.json"
BACKBONE_WEIGHTS_FILE = "model.safetensors"
REWARD_CONFIG_VERSION = 1
# the keys of reward_config.json the save writes itself, beside RewardModelInfo's own
_SAVE_KEYS = ("format_version", "backbone_class", "hidden_size")
_INFO_KEYS = ("rm_type", "score_stats", "normalizer", "termination")
_RESERVED_KEYS = _SAVE_KEYS + _INFO_KEYS


@dataclasses.dataclass
class RewardModelInfo:
    """What a reward-model directory's ``reward_config.json`` says of the model besides its weights.

    Fields:
        rm_type: ``"end"`` or ``"segment"``.
        score_stats: mean/std of end scores over the eval split (a :class:`ScoreStats` or its dict).
        normalizer: the fitted location-aware normaliser (segment RMs; a
            :class:`LocationNormalizer` or its dict).
        termination: the termination settings that cut segments (a dict or a dataclass such as
            ``MacroConfig``); required for a segment RM.
        extra: further JSON-serialisable keys, written at the top level of the file (the training
            step, the eval accuracy, a critic's role, ...); none may be a reserved key.

    >>> info = RewardModelInfo(score_stats={"mean": 0.5, "std": 2.0}, extra={"global_step": 3})
    >>> saved = info.to_json()
    >>> saved["rm_type"], saved["score_stats"], saved["global_step"]
    ('end', {'mean': 0.5, 'std': 2.0}, 3)
    >>> RewardModelInfo.from_json(saved).score_stats
    ScoreStats(mean=0.5, std=2.0)
    """

    rm_type: str = "end"
    score_stats: ScoreStats | dict | None = None
    normalizer: LocationNormalizer | dict | None = None
    termination: Any = None
    extra: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rm_type not in RM_TYPES:
            raise ValueError(f"rm_type must be one of {RM_TYPES}, got {self.rm_type!r}")
        if self.rm_type == "segment" and self.termination is None:
            raise ValueError("a segment reward model needs its termination settings")
        clash = sorted(set(self.extra) & set(_RESERVED_KEYS))
        if clash:
            raise ValueError(f"extra reuses reserved {REWARD_CONFIG_FILE} keys {clash}")

    def to_json(self) -> dict:
        """The file's keys this info gives, as plain JSON data (the save adds ``format_version``,
        ``backbone_class`` and ``hidden_size``)."""
        return {
            "rm_type": self.rm_type,
            "score_stats": _as_dict(self.score_stats, "score_stats"),
            "normalizer": _as_dict(self.normalizer, "normalizer"),
            "termination": _as_dict(self.termination, "termination"),
            **self.extra,
        }

    @classmethod
    def from_json(cls, saved: dict, where: str = REWARD_CONFIG_FILE) -> RewardModelInfo:
        """The info of a ``reward_config.json``'s keys ``saved`` (any version of the file):
        ``score_stats`` as a :class:`ScoreStats`, ``normalizer`` as a :class:`LocationNormalizer`,
        the keys of neither the info nor the save in ``extra``. A bad key raises ``ValueError``
        naming ``where``."""
        try:
            stats, norm = saved.get("score_stats"), saved.get("normalizer")
            return cls(
                rm_type=saved.get("rm_type"),
                score_stats=ScoreStats.from_dict(stats) if isinstance(stats, dict) else stats,
                normalizer=LocationNormalizer.from_dict(norm) if isinstance(norm, dict) else norm,
                termination=saved.get("termination"),
                extra={k: v for k, v in saved.items() if k not in _RESERVED_KEYS},
            )
        except KeyError as e:  # a score_stats or normalizer without one of its numbers
            raise ValueError(f"{where}: {e.args[0]!r} missing") from None
        except (ValueError, TypeError) as e:
            raise ValueError(f"{where}: {e}") from None


def end_score_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position of the last non-padding token of each row.

    ``attention_mask: (B, T)`` (bool or 0/1) -> ``(B,) long``. For a right-padded row this is
    ``length − 1``; a truncated row without padding gives ``T − 1``. Computed as the last 1 of the
    row, so rows that are also left-padded (a left-padded prompt followed by a right-padded
    response, as in PPO) work too. An all-padding row gives ``T − 1``.
    """
    if attention_mask.dim() != 2:
        raise ValueError(
            f"end_score_index: attention_mask must be (B, T), got {tuple(attention_mask.shape)}"
        )
    T = attention_mask.shape[1]
    # argmax returns the first maximum: on the flipped row, the first 1 is the last 1 of the row.
    return (T - 1) - (attention_mask != 0).flip(dims=[1]).long().argmax(dim=1)


def end_scores(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Value at the last non-padding token: ``values: (B, T)``, ``attention_mask: (B, T)`` -> ``(B,)``."""
    if values.shape != attention_mask.shape:
        raise ValueError(
            f"end_scores: values {tuple(values.shape)} and attention_mask "
            f"{tuple(attention_mask.shape)} must have the same (B, T) shape"
        )
    return values.gather(1, end_score_index(attention_mask).unsqueeze(1)).squeeze(1)


def padded_values(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, packing: bool = False
) -> torch.Tensor:
    """A value model's (or its engine's) ``values: (B, T)`` over a padded batch (``input_ids``,
    ``attention_mask``: (B, T)). With ``packing``, where the model runs packed rows exactly
    (:func:`marlhf.models.packing.packing_mode`), the rows go through it packed and come back in
    the batch's layout, 0 on padding: the padded values up to float rounding."""
    mode = packing_mode(model) if packing else None
    if not packs(attention_mask, mode):
        return model(input_ids=input_ids, attention_mask=attention_mask)
    p = pack_rows(input_ids, attention_mask, layout=mode)
    return p.unpack(model(**packed_inputs(p)))


def _hidden_size(config: Any) -> int:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.hidden_size)


class Float32Head(nn.Linear):
    """A linear head computed in float32 whatever its weights' dtype: under bf16 the backbone's
    hidden states and the head's weight are upcast before the product (a bf16 product would round
    every value and score to 8 significant bits, 3 decimal digits). A module call, so ZeRO-3 gathers
    its weight as for any layer; same parameters and state-dict keys as ``nn.Linear``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.float()
        return nn.functional.linear(x.float(), self.weight.float(), bias)


class RewardModel(nn.Module):
    """Base transformer + ``v_head = Linear(hidden, 1, bias=False)``: one scalar per position.

    Args:
        backbone: a Hugging Face base model (``AutoModel``: returns ``last_hidden_state``).
        init_std: std of the normal init of the value head; default ``1/sqrt(hidden + 1)`` as in
            Ziegler et al. (2019), so initial scores are O(1) whatever the width. Seed torch first for
            a reproducible head.

    ``config`` and ``backbone`` are exposed for DeepSpeed and peft; gradient checkpointing is
    delegated to the backbone.
    """

    def __init__(self, backbone: nn.Module, *, init_std: float | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        hidden = _hidden_size(backbone.config)
        param = next(backbone.parameters(), None)
        dtype = param.dtype if param is not None else None
        device = param.device if param is not None else None
        self.v_head = Float32Head(hidden, 1, bias=False, dtype=dtype, device=device)
        std = 1.0 / math.sqrt(hidden + 1) if init_std is None else init_std
        with _gathered(self.v_head.weight):
            nn.init.normal_(self.v_head.weight, mean=0.0, std=std)

    def reset_value_head(self, init_std: float | None = None) -> None:
        """Draw a new value head (as a new reward model gets): normal, std 1/sqrt(hidden + 1)."""
        hidden = self.v_head.in_features
        std = 1.0 / math.sqrt(hidden + 1) if init_std is None else init_std
        with _gathered(self.v_head.weight):
            nn.init.normal_(self.v_head.weight, mean=0.0, std=std)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        dtype: torch.dtype | None = None,
        device: str | torch.device = "cpu",
        init_std: float | None = None,
        **backbone_kwargs: Any,
    ) -> RewardModel:
        """A new reward model (fresh value head) on the backbone of a checkpoint directory.

        ``path`` may hold a ``*ForCausalLM`` checkpoint (an SFT output) or a base model; the base
        transformer's weights are loaded and it is an error (``ValueError``) if any of them is
        missing from the checkpoint, instead of the silent random init ``from_pretrained`` does.
        ``backbone_kwargs`` go to ``AutoModel.from_pretrained`` (e.g. ``attn_implementation``).
        """
        backbone = _load_backbone(path, dtype=dtype, **backbone_kwargs)
        return cls(backbone, init_std=init_std).to(device)

    @property
    def config(self) -> Any:
        """The backbone's Hugging Face config."""
        return self.backbone.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None = None,
        use_cache: bool = False,
        **attention_kwargs: Any,
    ) -> torch.Tensor:
        """``input_ids: (B, T)``, ``attention_mask: (B, T)`` -> ``values: (B, T) float32``.

        Positions default to ``cumsum(attention_mask) − 1`` (clamped at 0), the positions a model sees
        when it generates after a left-padded prompt; on right-padded rows this equals ``0..T-1`` on
        every real token. ``attention_mask=None``: rows are right-padded (or not padded), attention
        is plain causal and positions are ``0..T-1``; real tokens get the values they get with the
        mask (padding only follows them), at a lower cost. Packed rows
        (:mod:`marlhf.models.packing`): no mask, their ``position_ids``, and ``attention_kwargs``
        (flash-attention varlen arguments) passed to the backbone. ``use_cache``: taken for the
        causal LMs' call signature; a value model keeps no cache.
        """
        if position_ids is None and attention_mask is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        elif position_ids is None:
            position_ids = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)
        out = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **attention_kwargs,
        )
        hidden = out.last_hidden_state  # (B, T, hidden)
        return self.v_head(hidden).squeeze(-1).float()  # (B, T)

    def gradient_checkpointing_enable(
        self, gradient_checkpointing_kwargs: dict | None = None, **kwargs: Any
    ) -> None:
        """Checkpoint the backbone's layers (``kwargs`` such as ``every_n_layers`` go to it).

        Delegates to ``activation_checkpointing_enable`` (transformers >= 5; the old name is
        deprecated there) or ``gradient_checkpointing_enable``.
        """
        if hasattr(self.backbone, "activation_checkpointing_enable"):
            self.backbone.activation_checkpointing_enable(
                activation_checkpointing_kwargs=gradient_checkpointing_kwargs, **kwargs
            )
        else:
            self.backbone.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs=gradient_checkpointing_kwargs, **kwargs
            )

    def gradient_checkpointing_disable(self) -> None:
        if hasattr(self.backbone, "activation_checkpointing_disable"):
            self.backbone.activation_checkpointing_disable()
        else:
            self.backbone.gradient_checkpointing_disable()

    @property
    def is_gradient_checkpointing(self) -> bool:
        for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
            if hasattr(type(self.backbone), name):
                return bool(getattr(self.backbone, name))
        return False

    def enable_input_require_grads(self) -> None:
        """Needed with gradient checkpointing when the embeddings are frozen (LoRA)."""
        self.backbone.enable_input_require_grads()


def _gathered(param: torch.Tensor) -> contextlib.AbstractContextManager:
    """Context in which ``param`` holds its full data, also when built under ZeRO-3 ``zero.Init``
    (a partitioned parameter is empty until gathered; writes on rank 0 are broadcast on exit)."""
    if not hasattr(param, "ds_id"):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters([param], modifier_rank=0)


def _no_load_report(record: logging.LogRecord) -> bool:
    """A logging filter that drops transformers' LOAD REPORT table."""
    return "LOAD REPORT" not in record.getMessage()


def _load_backbone(
    path: str | os.PathLike, *, dtype: torch.dtype | None, **kwargs: Any
) -> nn.Module:
    from transformers import AutoModel

    if dtype is not None:
        kwargs["dtype"] = dtype
    # transformers reports the causal LM's head as "UNEXPECTED" when a value head's backbone is
    # loaded from it; the keys that matter (missing, mismatched) are checked here instead
    # (a filter, not a level: transformers reads its logger's level to decide what else to check)
    report = logging.getLogger("transformers.modeling_utils")
    report.addFilter(_no_load_report)
    try:
        backbone, loading = AutoModel.from_pretrained(str(path), output_loading_info=True, **kwargs)
    finally:
        report.removeFilter(_no_load_report)
    missing = sorted(loading.get("missing_keys", ()))
    mismatched = sorted(str(k) for k in loading.get("mismatched_keys", ()))
    if missing or mismatched:
        raise ValueError(
            f"{path}: the checkpoint does not hold all backbone weights of "
            f"{type(backbone).__name__} (they would be randomly initialised): "
            f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}, mismatched {mismatched[:8]}"
        )
    return backbone


def _as_dict(obj: Any, what: str) -> dict | None:
    if obj is None or isinstance(obj, dict):
        return obj
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    raise TypeError(
        f"save_reward_model: {what} must be a dict or dataclass, got {type(obj).__name__}"
    )


def reward_info(info: RewardModelInfo | None = None, **fields: Any) -> RewardModelInfo:
    """``info``, or the :class:`RewardModelInfo` of ``fields`` (its fields as keywords:
    ``rm_type=``, ``score_stats=``, ..., as every saver takes them too); not both. Neither: an end
    reward model with nothing more to say."""
    if info is not None and fields:
        raise TypeError(f"reward model: give the info or its fields {sorted(fields)}, not both")
    return info if info is not None else RewardModelInfo(**fields)


def save_reward_model(
    model: RewardModel,
    tokenizer: Any,
    path: str | os.PathLike,
    *,
    info: RewardModelInfo | None = None,
    **fields: Any,
) -> None:
    """Write ``model`` (and ``tokenizer``) as one reward-model directory; see the module docstring.

    Same as :func:`save_reward_model_state` with ``model.state_dict()`` and ``model.config``;
    ``info`` may also come as its fields (:func:`reward_info`).
    """
    info = reward_info(info, **fields)
    save_reward_model_state(model.state_dict(), model.config, tokenizer, path, info=info)


def save_reward_model_state(
    state_dict: dict[str, torch.Tensor],
    config: Any,
    tokenizer: Any,
    path: str | os.PathLike,
    *,
    info: RewardModelInfo | None = None,
    **fields: Any,
) -> None:
    """Write a reward-model directory from a plain state dict (e.g. ZeRO-3 weights gathered on rank 0).

    Args:
        state_dict: keys as in ``RewardModel.state_dict()``: ``backbone.*`` and ``v_head.weight``
            (tensors on any device; they are copied to CPU).
        config: the backbone's Hugging Face config (not modified; a copy is saved with
            ``architectures`` set to the base-model class and ``dtype`` to the weights' dtype).
        tokenizer: saved with ``save_pretrained``; ``None`` to skip.
        path: output directory (created).
        info: what ``reward_config.json`` says of the model, or its fields as keywords
            (:func:`reward_info`; neither: an end RM, nothing more).
    """
    from transformers import MODEL_MAPPING

    info = reward_info(info, **fields)
    backbone_sd: dict[str, torch.Tensor] = {}
    head_sd: dict[str, torch.Tensor] = {}
    unexpected = []
    seen_storage: set[int] = set()
    for key, tensor in state_dict.items():
        tensor = tensor.detach().to("cpu").contiguous()
        # safetensors refuses tensors that share memory (tied weights): store copies.
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen_storage:
            tensor = tensor.clone()
        seen_storage.add(tensor.untyped_storage().data_ptr())
        if key.startswith("backbone."):
            backbone_sd[key[len("backbone.") :]] = tensor
        elif key == "v_head.weight":
            head_sd["weight"] = tensor
        else:
            unexpected.append(key)
    if unexpected or "weight" not in head_sd or not backbone_sd:
        raise ValueError(
            "save_reward_model_state: state_dict must hold backbone.* and v_head.weight only; "
            f"unexpected {unexpected[:8]}, has v_head.weight: {'weight' in head_sd}, "
            f"backbone tensors: {len(backbone_sd)}"
        )

    config = copy.deepcopy(config)
    base_cls = MODEL_MAPPING[type(config)] if type(config) in MODEL_MAPPING else None
    if base_cls is not None:
        config.architectures = [base_cls.__name__]
    float_dtypes = [t.dtype for t in backbone_sd.values() if t.is_floating_point()]
    if float_dtypes:
        config.dtype = float_dtypes[0]
    saved = {
        "format_version": REWARD_CONFIG_VERSION,
        "backbone_class": base_cls.__name__ if base_cls is not None else None,
        "hidden_size": int(head_sd["weight"].shape[1]),
        **info.to_json(),
    }
    _write_reward_dir(path, config, backbone_sd, head_sd, tokenizer, saved)


def _write_reward_dir(
    path, config, backbone_sd: dict, head_sd: dict, tokenizer, saved: dict
) -> None:
    """Write the files of a reward-model directory; ``reward_config.json`` last and atomically (a
    temporary renamed over it). A full disk raises ``OSError(ENOSPC)`` naming the directory."""
    from safetensors.torch import save_file

    with naming_write_errors(
        path, "reward-model checkpoint", "A resume starts from the last complete training state."
    ):
        os.makedirs(path, exist_ok=True)
        config.save_pretrained(str(path))
        save_file(backbone_sd, os.path.join(path, BACKBONE_WEIGHTS_FILE), metadata={"format": "pt"})
        save_file(head_sd, os.path.join(path, VALUE_HEAD_FILE), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save_pretrained(str(path))
        target = os.path.join(path, REWARD_CONFIG_FILE)
        with open(target + ".tmp", "w") as f:
            json.dump(saved, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(target + ".tmp", target)


def load_reward_model(
    path: str | os.PathLike,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    **backbone_kwargs: Any,
) -> tuple[RewardModel, dict]:
    """Load a directory written by :func:`save_reward_model`.

    Args:
        dtype: parameter dtype; ``None`` keeps the saved dtype.
        device: where to put the model.
        backbone_kwargs: passed to ``AutoModel.from_pretrained`` (e.g. ``attn_implementation``).

    Returns:
        ``(model, info)``: ``info`` is ``reward_config.json``'s dict with ``score_stats`` as a
        :class:`ScoreStats` and ``normalizer`` as a :class:`LocationNormalizer` (or ``None``);
        ``RewardModelInfo.from_json(info)`` gives it as a :class:`RewardModelInfo`.
    """
    from safetensors.torch import load_file

    cfg_path = os.path.join(path, REWARD_CONFIG_FILE)
    head_path = os.path.join(path, VALUE_HEAD_FILE)
    for p in (cfg_path, head_path):
        if not os.path.isfile(p):
            raise FileNotFoundError(f"{p} missing: {path} is not a reward-model directory")
    with open(cfg_path) as f:
        saved = json.load(f)
    info = RewardModelInfo.from_json(saved, cfg_path)

    backbone = _load_backbone(path, dtype=dtype, **backbone_kwargs)
    model = RewardModel(backbone, init_std=0.0)
    head = load_file(head_path)
    if set(head) != {"weight"} or tuple(head["weight"].shape) != tuple(model.v_head.weight.shape):
        raise ValueError(
            f"{head_path}: expected one tensor 'weight' of shape {tuple(model.v_head.weight.shape)}, "
            f"got {{{', '.join(f'{k}: {tuple(v.shape)}' for k, v in head.items())}}}"
        )
    with torch.no_grad(), _gathered(model.v_head.weight):
        model.v_head.weight.copy_(head["weight"])
    model.to(device)
    return model, {**saved, "score_stats": info.score_stats, "normalizer": info.normalizer}


def load_value_head(model, path: str) -> None:
    """Copy ``path``/value_head.safetensors (``{"weight": (1, hidden)}``) into ``model.v_head``."""
    from safetensors.torch import load_file

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
