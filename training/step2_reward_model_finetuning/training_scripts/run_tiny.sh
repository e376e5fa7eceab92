#!/usr/bin/env bash
# Stage 2 (reward model) on the embedded default: the bundled synthetic TL;DR comparisons on CPU in
# about a minute, starting from the tiny SFT output of step 1 (or `tiny` itself).
# Usage: run_tiny.sh [MODEL (SFT dir or an embedded model: tiny, tiny-base, tiny-base-64, ...)] [OUTPUT_DIR] [extra flags...]
# e.g. run_tiny.sh ./output/tiny/sft ./output/tiny/rm
#      run_tiny.sh ./output/tiny/sft ./output/tiny/rm_segment --rm_type segment \
#          --termination_condition fixed --ngram 3
set -euo pipefail
CMD=$(printf '%q ' "$0" "$@")  # for the log's header line
MODEL=${1:-./output/tiny/sft}
OUTPUT=${2:-./output/tiny/rm}
shift 2 || shift $# || true
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
mkdir -p "$OUTPUT"
ARGS=(
   --model_name_or_path "$MODEL"
   --data_path synthetic-tldr
   --data_split 2,4,4
   --data_output_path "$OUTPUT/../data_cache"
   --max_seq_len 256
   --per_device_train_batch_size 16
   --per_device_eval_batch_size 32
   --gradient_accumulation_steps 1
   --learning_rate 1e-3
   --weight_decay 0.0
   --num_train_epochs 1
   --lr_scheduler_type cosine
   --warmup_ratio 0.1
   --seed 1234
   --zero_stage 0
   --dtype fp32
   --eval_interval 10
   --enable_tensorboard
   --output_dir "$OUTPUT"
   "$@"
)
LOG="$OUTPUT/training.log"  # appended to, with one header line per run
echo "=== $(date '+%Y-%m-%d %H:%M:%S %z') $CMD" >> "$LOG"
# models and data are checked once here, before any rank starts (a missing SFT directory: run
# step 1's run_tiny.sh first, or pass an embedded model)
python -m marlhf.preflight rm "${ARGS[@]}" 2>&1 | tee -a "$LOG"
python -m marlhf.stages.reward "${ARGS[@]}" 2>&1 | tee -a "$LOG"
