#!/usr/bin/env bash
# Stage 3, MA-PPO with the paper's Gemma-2B TL;DR recipe: fixed n-gram macro actions (n=5), equal
# value weights, KL 0.05, temperature 0.8, top-k 50, actor/critic lr 1.5e-5, gamma 1, lambda 0.95,
# clip 0.2, prompt/answer 512/512, 256 sequences per PPO update (8 GPUs x 8 x 4 generation batches).
# Usage: run_gemma.sh OUTPUT_DIR SFT_DIR RM_DIR [extra flags...]   (e.g. --ngram 1 for vanilla PPO)
set -euo pipefail
CMD=$(printf '%q ' "$0" "$@")  # for the log's header line
OUTPUT=${1:?usage: run_gemma.sh OUTPUT_DIR SFT_DIR RM_DIR [flags...]}
ACTOR=${2:?SFT model directory}
CRITIC=${3:?reward model directory}
shift 3
NUM_GPUS=${NUM_GPUS:-8}
mkdir -p "$OUTPUT"
ARGS=(
   --actor_model_name_or_path "$ACTOR"
   --critic_model_name_or_path "$CRITIC"
   --data_path openai/summarize_from_feedback
   --data_split 2,4,4
   --data_output_path "$OUTPUT/../data_cache"
   --max_prompt_seq_len 512
   --max_answer_seq_len 512
   --per_device_generation_batch_size 8
   --generation_batches $((256 / (8 * NUM_GPUS)))
   --per_device_training_batch_size 8
   --gradient_accumulation_steps $((256 / (8 * NUM_GPUS)))
   --ppo_epochs 1
   --num_train_epochs 1
   --actor_learning_rate 1.5e-5
   --critic_learning_rate 1.5e-5
   --actor_weight_decay 0.1
   --critic_weight_decay 0.1
   --lr_scheduler_type linear
   --num_warmup_steps 200
   --temperature 0.8 --top_k 50 --top_p 1.0
   --kl_ctl 0.05 --gamma 1.0 --lam 0.95 --cliprange 0.2 --cliprange_value 0.2 --reward_clip 2.5
   --termination_condition fixed --ngram 5 --value_function equal
   --actor_zero_stage 2 --critic_zero_stage 3
   --actor_gradient_checkpointing --critic_gradient_checkpointing
   --dtype bf16
   --seed 1234
   --enable_tensorboard
   --save_steps 100
   --output_dir "$OUTPUT"
   "$@"
)
LOG="$OUTPUT/training.log"  # appended to, with one header line per run
echo "=== $(date '+%Y-%m-%d %H:%M:%S %z') $CMD" >> "$LOG"
# models and data are checked once here, before any rank starts
python -m marlhf.preflight ppo "${ARGS[@]}" 2>&1 | tee -a "$LOG"
deepspeed --num_gpus "$NUM_GPUS" ${DS_LAUNCH_ARGS:-} --module marlhf.stages.ppo "${ARGS[@]}" 2>&1 | tee -a "$LOG"
