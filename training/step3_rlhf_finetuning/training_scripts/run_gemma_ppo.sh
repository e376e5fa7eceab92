#!/usr/bin/env bash
# Vanilla (token-level) PPO baseline with the same recipe as run_gemma.sh: fixed n=1 is PPO exactly.
# Usage: run_gemma_ppo.sh OUTPUT_DIR SFT_DIR RM_DIR [extra flags...]
set -euo pipefail
exec bash "$(dirname "$0")/run_gemma.sh" "$@" --termination_condition fixed --ngram 1
