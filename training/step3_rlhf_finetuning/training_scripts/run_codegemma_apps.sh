#!/usr/bin/env bash
# Stage 3 on APPS (program synthesis), the paper's CodeGemma-2B recipe: no reward model — the reward is
# the generated program's result on the task's test cases, run in the sandbox (pass fraction with
# PPOCoder-style compile/runtime-error penalties); fixed n=10 macro actions; batch 16; actor lr 5e-7,
# critic lr 5e-5; prompt 600 / answer 512; temperature 1.0, top-k 5; data split 2,0,8 (20 % SFT, 80 % PPO).
# Usage: run_codegemma_apps.sh OUTPUT_DIR SFT_DIR [extra flags...]
set -euo pipefail
CMD=$(printf '%q ' "$0" "$@")  # for the log's header line
OUTPUT=${1:?usage: run_codegemma_apps.sh OUTPUT_DIR SFT_DIR [flags...]}
ACTOR=${2:?SFT model directory}
shift 2
NUM_GPUS=${NUM_GPUS:-8}
mkdir -p "$OUTPUT"
ARGS=(
   --actor_model_name_or_path "$ACTOR"
   --critic_model_name_or_path "$ACTOR"
   --reward_source code --code_reward_scheme ppocoder --code_timeout_s 4 --code_workers 8
   --data_path codeparrot/apps --data_split 2,0,8
   --data_output_path "$OUTPUT/../data_cache"
   --max_prompt_seq_len 600 --max_answer_seq_len 512
   --per_device_generation_batch_size 2 --generation_batches 1
   --per_device_training_batch_size 2 --gradient_accumulation_steps 1
   --actor_learning_rate 5e-7 --critic_learning_rate 5e-5
   --lr_scheduler_type cosine --num_warmup_steps 20
   --temperature 1.0 --top_k 5 --top_p 1.0
   --kl_ctl 0.05 --gamma 1.0 --lam 0.95
   --termination_condition fixed --ngram 10
   --actor_zero_stage 2 --critic_zero_stage 2 --dtype bf16
   --save_steps 100 --output_dir "$OUTPUT"
   "$@"
)
LOG="$OUTPUT/training.log"  # appended to, with one header line per run
echo "=== $(date '+%Y-%m-%d %H:%M:%S %z') $CMD" >> "$LOG"
# models and data are checked once here, before any rank starts
python -m marlhf.preflight ppo "${ARGS[@]}" 2>&1 | tee -a "$LOG"
deepspeed --num_gpus "$NUM_GPUS" ${DS_LAUNCH_ARGS:-} --module marlhf.stages.ppo "${ARGS[@]}" 2>&1 | tee -a "$LOG"
