#!/usr/bin/env bash
# Stage 1 (SFT) on the embedded default: the tiny Gemma-architecture model, shipped pretrained
# (tiny-base, see marlhf/pipeline/recipes.py), and the bundled synthetic TL;DR data, on CPU in under a minute. Usage: run_tiny.sh [OUTPUT_DIR] [extra flags...]
set -euo pipefail
CMD=$(printf '%q ' "$0" "$@")  # for the log's header line
OUTPUT=${1:-./output/tiny/sft}
shift || true
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
mkdir -p "$OUTPUT"
ARGS=(
   --model_name_or_path tiny-base
   --data_path synthetic-tldr
   --data_split 2,4,4
   --data_output_path "$OUTPUT/../data_cache"
   --max_seq_len 256
   --per_device_train_batch_size 16
   --per_device_eval_batch_size 32
   --gradient_accumulation_steps 1
   --learning_rate 5e-4
   --weight_decay 0.0
   --num_train_epochs 2
   --lr_scheduler_type cosine
   --warmup_ratio 0.05
   --seed 1234
   --zero_stage 0
   --dtype fp32
   --enable_tensorboard
   --output_dir "$OUTPUT"
   "$@"
)
LOG="$OUTPUT/training.log"  # appended to, with one header line per run
echo "=== $(date '+%Y-%m-%d %H:%M:%S %z') $CMD" >> "$LOG"
# models and data are checked once here, before any rank starts
python -m marlhf.preflight sft "${ARGS[@]}" 2>&1 | tee -a "$LOG"
python -m marlhf.stages.sft "${ARGS[@]}" 2>&1 | tee -a "$LOG"
