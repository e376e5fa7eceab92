#!/usr/bin/env bash
# Stage 2 (reward model), the paper's Gemma-2B TL;DR recipe (README hyper-parameter table: batch 64,
# 1 epoch, lr 1e-5, cosine, warm-up ratio 0.1), through the deepspeed launcher on one node of 8 GPUs.
# Usage: run_gemma.sh SFT_DIR OUTPUT_DIR [extra flags...]   (multi-node: add --hostfile via DS_LAUNCH_ARGS)
# Global batch = per-device 8 pairs x 8 GPUs x accumulation 1 = 64 pairs.
# Segment-level RM (Segment-PPO): add --rm_type segment --termination_condition entropy
#   --entropy_threshold 2.0 (the entropies come from SFT_DIR, or --reference_model_name_or_path).
set -euo pipefail
CMD=$(printf '%q ' "$0" "$@")  # for the log's header line
SFT=${1:?usage: run_gemma.sh SFT_DIR OUTPUT_DIR [flags...]}
OUTPUT=${2:?usage: run_gemma.sh SFT_DIR OUTPUT_DIR [flags...]}
shift 2
NUM_GPUS=${NUM_GPUS:-8}
mkdir -p "$OUTPUT"
ARGS=(
   --model_name_or_path "$SFT"
   --data_path openai/summarize_from_feedback
   --data_split 2,4,4
   --data_output_path "$OUTPUT/../data_cache"
   --max_seq_len 512
   --per_device_train_batch_size 8
   --per_device_eval_batch_size 8
   --gradient_accumulation_steps $((64 / (8 * NUM_GPUS)))
   --learning_rate 1e-5
   --weight_decay 0.0
   --num_train_epochs 1
   --lr_scheduler_type cosine
   --warmup_ratio 0.1
   --seed 1234
   --gradient_checkpointing
   --zero_stage 3
   --dtype bf16
   --rm_type end
   --eval_interval 100
   --eval_iters 100
   --enable_tensorboard
   --save_steps 200
   --output_dir "$OUTPUT"
   "$@"
)
LOG="$OUTPUT/training.log"  # appended to, with one header line per run
echo "=== $(date '+%Y-%m-%d %H:%M:%S %z') $CMD" >> "$LOG"
# models and data are checked once here, before any rank starts
python -m marlhf.preflight rm "${ARGS[@]}" 2>&1 | tee -a "$LOG"
deepspeed --num_gpus "$NUM_GPUS" ${DS_LAUNCH_ARGS:-} --module marlhf.stages.reward "${ARGS[@]}" 2>&1 | tee -a "$LOG"
