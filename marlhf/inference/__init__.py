"""Inference: sample responses for validation prompts and score them with the reward model (if any).

The program behind ``inference/inference_with_rewards.py`` (MA-RLHF README, "Inference")::

    python inference/inference_with_rewards.py --proj-path $PROJ --dataset summarize \
        --model $ACTOR --reward-model $RM --temperature 0.8 --gpu 0 --batch-size 16

1. **Prompts.** The ``--split`` (default eval) examples of ``--dataset`` are de-duplicated by
   ``prompt_id`` (comparison datasets list a post once per pair) and the ``--num-samples`` prompts
   with the smallest ``sha256(f"{seed}:{prompt_id}")`` are kept, in that order (``seed``:
   ``--prompt-seed``, else ``--seed``). The choice depends only on the set of prompts and the seed —
   not on the batch size, the file order or an earlier run — and a smaller ``--num-samples`` gives a
   prefix of a larger one.
2. **Generation.** ``bos + prompt`` (cut from the left to ``--max_prompt_seq_len``, as PPO does
   with ``truncate_left``) is left-padded and sampled with ``--temperature/--top_k/--top_p`` for at
   most ``--max_answer_seq_len`` tokens, by the backend of ``--generation_backend``
   (:mod:`marlhf.models.generation`, the sampling flags shared with PPO; ``hf`` by default, whose
   draws are seeded per batch from ``--seed`` and the batch's first prompt; a backend that seeds
   rows draws each prompt's samples from ``--seed`` and its id). The response is valid up to and
   including its first EOS (:func:`marlhf.models.sequences.response_mask`). The models and the
   lengths (prompt + response within each model's context) are checked before anything is loaded.
3. **Score** (with ``--reward-model``). Prompt and response are packed flush-left
   (:func:`marlhf.models.sequences.pack_flush_left`) and the RM's value at the last valid token is
   the reward, exactly as PPO scores a rollout (EOS included; a response cut at the length limit is
   scored at its last token). An RM with a different vocabulary re-tokenises the text instead
   (``bos + prompt + response + eos``). Without a reward model the responses are only sampled.
4. **Output.** ``${proj_path}/results/${dataset}/temperature=${T}/${model_name}.jsonl``, one JSON
   object per prompt: ``prompt_id, prompt, response, reward, response_tokens, ends_with_eos``
   (``reward`` only with a reward model; + ``gold`` on the synthetic task; + ``chosen_*``/
   ``rejected_*`` with ``--ref-scores``; APPS rows add ``responses``, ``rewards``, ``n_correct``). The settings go to ``<output>.meta.json`` and a
   summary to ``<output>.summary.json``. Naming rule (:func:`output_path`):

   - ``${model_name}``: the path of ``--model`` relative to ``--proj-path`` when the model lies
     inside it (``runs/llama/sft`` -> ``runs-llama-sft``, ``runs/llama/mappo_n5/actor`` ->
     ``runs-llama-mappo_n5-actor``), otherwise its last three path components
     (``/ckpt/run1/checkpoints/step-100`` -> ``run1-checkpoints-step-100``; a hub id
     ``google/gemma-2b`` -> ``google-gemma-2b``): components joined with ``-``, other characters
     than ``A-Za-z0-9._=+-`` replaced by ``_``. With ``--ref-scores``: ``ref-scores-`` + the reward
     model's name by the same rule.
   - ``${dataset}``: the dataset's short name (:mod:`marlhf.data.names`: ``hh`` -> ``hh-rlhf``,
     ``openai/summarize_from_feedback`` -> ``summarize``); a local file: its name without the
     extension (``data/webgpt.jsonl`` -> ``webgpt``); a local directory or another spec: its last
     component.

Resuming: rows are appended, flushed and fsynced after every batch; a re-run skips prompt ids
already in the file (a half-written last line from a killed run is cut off first). A re-run whose
settings differ from the sidecar's is refused unless ``--overwrite`` — unless the output has no row
yet (a run that failed before writing any): then the new settings replace the old ones.

``--ref-scores`` scores the dataset's own chosen/rejected responses instead of generating
(``response``/``reward`` are then the chosen ones). APPS (``--dataset apps``) samples
``--n-samples-per-prompt`` programs per problem, runs them on the problem's tests in the sandbox
(:mod:`marlhf.rewards.code`), uses the pass fraction as reward and reports unbiased pass@k.

>>> from marlhf.inference import dataset_dir_name, dataset_spec, model_name
>>> model_name("/runs/run1/checkpoints/step-100")
'run1-checkpoints-step-100'
>>> model_name("google/gemma-2b"), model_name("tiny")
('google-gemma-2b', 'tiny')
>>> model_name("/p/runs/llama/mappo_n5/actor", proj_path="/p")
'runs-llama-mappo_n5-actor'
>>> dataset_spec("summarize"), dataset_spec("hh"), dataset_spec("data/my.jsonl")
('openai/summarize_from_feedback', 'Dahoas/full-hh-rlhf', 'data/my.jsonl')
>>> dataset_dir_name("hh"), dataset_dir_name("data/webgpt.jsonl"), dataset_dir_name("plain:d/x.json")
('hh-rlhf', 'webgpt', 'x')

Modules: :mod:`~marlhf.inference.config` (flags), :mod:`~marlhf.inference.naming` (output names and
paths), :mod:`~marlhf.inference.prompts` (selection and encoding), :mod:`~marlhf.inference.results`
(the result file: resume, append, summary), :mod:`~marlhf.inference.models` (loading),
:mod:`~marlhf.inference.generation` (sampling through the generation backend),
:mod:`~marlhf.inference.scoring` (RM scores,
:class:`TextScorer`), :mod:`~marlhf.inference.rows` (a batch -> rows),
:mod:`~marlhf.inference.macro_view` (``--render-macro``) and :mod:`~marlhf.inference.run` (the
program). The names below are the public API.
"""

from __future__ import annotations

from marlhf.data.names import DATASETS
from marlhf.inference.config import DTYPE_CHOICES, GOLD_CHOICES, InferenceArgs, InferenceConfig
from marlhf.inference.naming import dataset_dir_name, dataset_spec, model_name, output_path, sidecar
from marlhf.inference.results import (
    append_rows,
    prepare_output,
    read_rows,
    repair_tail,
    run_settings,
    summarize,
)
from marlhf.plugins import lazy_attributes

# The names that need torch load their module on first use: the flags (``--help``) and the result
# files import without it.
_LAZY = {
    "generate": "marlhf.inference.generation",
    "left_pad": "marlhf.inference.prompts",
    "select_prompts": "marlhf.inference.prompts",
    "selection_key": "marlhf.inference.prompts",
    "main": "marlhf.inference.run",
    "run_inference": "marlhf.inference.run",
    "TextScorer": "marlhf.inference.scoring",
    "end_rewards": "marlhf.inference.scoring",
    "right_pad": "marlhf.inference.scoring",
    "score_rollout": "marlhf.inference.scoring",
}


__getattr__ = lazy_attributes(__name__, _LAZY, globals())


__all__ = [
    "DATASETS",
    "DTYPE_CHOICES",
    "GOLD_CHOICES",
    "InferenceArgs",
    "InferenceConfig",
    "TextScorer",
    "append_rows",
    "dataset_dir_name",
    "dataset_spec",
    "end_rewards",
    "generate",
    "left_pad",
    "main",
    "model_name",
    "output_path",
    "prepare_output",
    "read_rows",
    "repair_tail",
    "right_pad",
    "run_inference",
    "run_settings",
    "score_rollout",
    "select_prompts",
    "selection_key",
    "sidecar",
    "summarize",
]
