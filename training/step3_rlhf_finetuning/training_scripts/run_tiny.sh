#!/usr/bin/env bash
# Stage 3 (MA-PPO, fixed n=5) on the embedded default, on CPU: the tiny SFT policy and tiny reward model
# from stages 1 and 2 on the bundled synthetic TL;DR prompts.
# Usage: run_tiny.sh OUTPUT_DIR SFT_DIR RM_DIR [extra flags...]   (--ngram 1: vanilla PPO)
# RM_DIR "-": no reward model, e.g. the oracle reward on a long task, the critic starting from the
# actor with a fresh value head:
#   run_tiny.sh out/oracle tiny-base-64 - --reward_source gold --data_path synthetic-facts-64 \
#       --max_prompt_seq_len 256 --max_answer_seq_len 112
# With DS_LAUNCH_ARGS set it launches through `deepspeed` (NUM_GPUS processes per node, default 1),
# as run_gemma.sh does: the guide's multi-node recipe (docs/guide/scale.md), tested on one machine.
set -euo pipefail
CMD=$(printf '%q ' "$0" "$@")  # for the log's header line
OUTPUT=${1:?usage: run_tiny.sh OUTPUT_DIR SFT_DIR RM_DIR [flags...]}
ACTOR=${2:?SFT model directory}
CRITIC=${3:?reward model directory, or - for none}
shift 3
if [ "$CRITIC" = - ]; then CRITIC=""; fi  # an empty --critic_model_name_or_path: the actor's
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
mkdir -p "$OUTPUT"
ARGS=(
   --actor_model_name_or_path "$ACTOR"
   --critic_model_name_or_path "$CRITIC"
   --data_path synthetic-tldr
   --data_output_path "$OUTPUT/../data_cache"
   --max_prompt_seq_len 160 --max_answer_seq_len 40
   --per_device_generation_batch_size 16 --per_device_training_batch_size 8
   --actor_learning_rate 2e-4 --critic_learning_rate 5e-4 --lr_scheduler_type constant
   --kl_ctl 0.05 --temperature 1.0 --top_k 0
   --termination_condition fixed --ngram 5 --value_function equal
   --max_steps 30
   --output_dir "$OUTPUT"
   "$@"
)
LOG="$OUTPUT/training.log"  # appended to, with one header line per run
echo "=== $(date '+%Y-%m-%d %H:%M:%S %z') $CMD" >> "$LOG"
# models and data are checked once here, before any rank starts
python -m marlhf.preflight ppo "${ARGS[@]}" 2>&1 | tee -a "$LOG"
LAUNCH=(python -m)
if [ -n "${DS_LAUNCH_ARGS:-}" ]; then  # through the deepspeed launcher (e.g. one node of several)
   LAUNCH=(deepspeed --num_gpus "${NUM_GPUS:-1}" $DS_LAUNCH_ARGS --module)
fi
"${LAUNCH[@]}" marlhf.stages.ppo "${ARGS[@]}" 2>&1 | tee -a "$LOG"
