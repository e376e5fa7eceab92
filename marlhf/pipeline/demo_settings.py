"""The demo's settings for each synthetic task it can run (``python -m marlhf.demo --task``).

``synthetic-verdict-64`` (the default; :mod:`marlhf.data.long_tasks`): 64-token answers whose first
fact gives a verdict worth ±0.5 of a score paid only at the end of the answer, so credit has to
travel the whole answer: the setting in which macro actions made the difference in the horizon
sweep (docs/results.md, "Does MA-PPO beat PPO?"). Its stages start from the shipped
``tiny-base-64`` and use the sweep's PPO settings (λ = 0.95).

``synthetic-tldr`` (:mod:`marlhf.data.synthetic`): 15-20-token TL;DR-like summaries from
``tiny-base``, the reward model from the preference-pretrained ``tiny-rm-base``. At this length
macro actions make no difference beyond seed noise, and one run's comparison of PPO and MA-PPO can
go either way with the thread count (docs/research/demo.md);
``benchmarks/ppo_vs_mappo.py`` builds on its flags.

Everything is sized for 2 CPU cores; the real recipes are in training/*/run_gemma.sh.
"""

from __future__ import annotations

from dataclasses import dataclass

# --- synthetic-tldr ---------------------------------------------------------------------------------
# The supervised stages' data, batch sizes and schedule shape, the same for SFT and the reward model:
_SUPERVISED_FLAGS = [
    "--data_path", "synthetic-tldr",
    "--max_seq_len", "192",
    "--per_device_train_batch_size", "16",
    "--per_device_eval_batch_size", "32",
    "--warmup_ratio", "0.05",
    "--zero_stage", "0",
]  # fmt: skip
SFT_FLAGS = [
    "--model_name_or_path", "tiny-base",
    *_SUPERVISED_FLAGS,
    "--learning_rate", "5e-4",
    "--num_train_epochs", "2",
    "--lr_scheduler_type", "cosine",
    "--eval_iters", "4",
]  # fmt: skip
RM_FLAGS = [
    *_SUPERVISED_FLAGS,
    "--learning_rate", "3e-4",
    "--num_train_epochs", "4",
    "--eval_iters", "8",
]  # fmt: skip
# The TL;DR reward model starts from tiny-rm-base (larger than the policy and preference-pretrained
# on generated comparisons, see marlhf.tiny) with its value head, and trains gently on the bundled
# comparisons plus comparisons of the SFT model's own answers (later flags win over RM_FLAGS).
RM_BASE_FLAGS = ["--model_name_or_path", "tiny-rm-base", "--init_value_head"]
RM_BASE_FLAGS += ["--learning_rate", "1e-4", "--num_train_epochs", "2"]
PPO_FLAGS = [
    "--data_path", "synthetic-tldr",
    "--max_prompt_seq_len", "160",
    "--max_answer_seq_len", "40",
    "--per_device_generation_batch_size", "16",
    "--per_device_training_batch_size", "8",
    "--actor_learning_rate", "2e-4",
    "--critic_learning_rate", "5e-4",
    "--kl_ctl", "0.05",
    "--temperature", "1.0",
    "--top_k", "0",
    "--ppo_epochs", "1",
    "--lr_scheduler_type", "constant",
    "--value_function", "equal",
]  # fmt: skip
# With the learned RM on TL;DR: tiny-rm-base's scores spread over several units, so PPO
# standardises them with the RM's saved eval mean/std before its ±2.5 clip, scores a response cut
# at the length limit 1 lower (an RM trained on finished summaries misjudges cut ones) and keeps
# closer to the SFT model (KL coefficient 0.2: at 0.05 both arms drifted to openers the RM
# over-scores; docs/research/reward-model.md, "A reward model that learns").
LEARNED_RM_PPO_FLAGS = ["--normalize_reward", "--no_eos_penalty", "-1", "--kl_ctl", "0.2"]

# --- synthetic-verdict-64 ---------------------------------------------------------------------------
# Prompts reach 221 tokens and answers 81 (marlhf.data.long_tasks): the horizon sweep's lengths.
VERDICT_SFT_FLAGS = [
    "--model_name_or_path", "tiny-base-64",
    "--data_path", "synthetic-verdict-64",
    "--max_seq_len", "368",
    "--per_device_train_batch_size", "16",
    "--per_device_eval_batch_size", "32",
    "--learning_rate", "1e-4",
    "--num_train_epochs", "1",
    "--warmup_ratio", "0.05",
    "--lr_scheduler_type", "cosine",
    "--zero_stage", "0",
    "--eval_iters", "4",
]  # fmt: skip
# One pass over the 760 comparisons of the RM's share from tiny-base-64 (with a fresh value head):
# the most the demo's time allows (53 steps of 16 pairs of 300-token sequences).
VERDICT_RM_FLAGS = [
    "--model_name_or_path", "tiny-base-64",
    "--data_path", "synthetic-verdict-64",
    "--max_seq_len", "368",
    "--per_device_train_batch_size", "16",
    "--per_device_eval_batch_size", "16",
    "--learning_rate", "3e-4",
    "--num_train_epochs", "1",
    "--warmup_ratio", "0.05",
    "--zero_stage", "0",
    "--eval_iters", "0",
]  # fmt: skip
# PPO on the long tasks, shared with the horizon sweep (benchmarks/horizon_sweep.py, PPO_FLAGS): the
# oracle PPO run of tests/stages/test_ppo_long_horizon.py (actor lr 1e-4, kl 0.01, T = 1, one epoch
# of 2 minibatches)
LONG_TASK_PPO_FLAGS = [
    "--per_device_generation_batch_size", "16",
    "--per_device_training_batch_size", "8",
    "--actor_learning_rate", "1e-4",
    "--critic_learning_rate", "5e-4",
    "--kl_ctl", "0.01",
    "--temperature", "1.0",
    "--top_k", "0",
    "--ppo_epochs", "1",
    "--lr_scheduler_type", "constant",
]  # fmt: skip
VERDICT_PPO_FLAGS = [
    "--data_path", "synthetic-verdict-64",
    "--max_prompt_seq_len", "256",
    "--max_answer_seq_len", "112",
    *LONG_TASK_PPO_FLAGS,
    "--lam", "0.95",
]  # fmt: skip


@dataclass(frozen=True)
class DemoTask:
    """What the demo runs for one task: the stages' flags and the sizes of its sampling steps.

    ``inference_dataset``: the task as the inference program names it; ``label_prompts``: train
    prompts whose two SFT answers are labelled (0: all); ``ngram``, ``ppo_steps`` and
    ``eval_prompts``: the defaults of ``--ngram``, ``--ppo_steps`` and ``--eval_prompts``;
    ``eval_temperature``: the sampling temperature of the held-out answers."""

    name: str
    inference_dataset: str
    sft: list[str]
    rm: list[str]
    ppo: list[str]
    learned_rm_ppo: list[str]
    prompt_len: int
    answer_len: int
    label_prompts: int
    ngram: int
    ppo_steps: int
    eval_prompts: int
    eval_temperature: float = 0.8


TASKS = {
    t.name: t
    for t in (
        DemoTask(
            "synthetic-verdict-64",
            "synthetic-verdict-64",
            VERDICT_SFT_FLAGS,
            VERDICT_RM_FLAGS,
            VERDICT_PPO_FLAGS,
            [],  # the sweep's learned-RM runs: the RM's raw score, KL coefficient 0.01
            prompt_len=256,
            answer_len=112,
            # 2 x 256 answers: the RM stage's data split takes 40 % of the pairs
            label_prompts=256,
            ngram=10,
            ppo_steps=30,
            eval_prompts=200,
        ),
        DemoTask(
            "synthetic-tldr",
            "synthetic",
            SFT_FLAGS,
            [*RM_FLAGS, *RM_BASE_FLAGS],
            PPO_FLAGS,
            LEARNED_RM_PPO_FLAGS,
            prompt_len=160,
            answer_len=40,
            label_prompts=0,
            ngram=5,
            # one pass over the 760 PPO prompts in rollouts of 16 (30 steps were too few for a
            # gain above seed noise; docs/research/reward-model.md, "A reward model that learns")
            ppo_steps=47,
            eval_prompts=300,
        ),
    )
}
DEFAULT_TASK = "synthetic-verdict-64"
