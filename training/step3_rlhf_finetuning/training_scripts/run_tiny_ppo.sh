#!/usr/bin/env bash
# Vanilla PPO (fixed n=1) on the embedded default. Usage: run_tiny_ppo.sh OUTPUT_DIR SFT_DIR RM_DIR [flags...]
set -euo pipefail
exec bash "$(dirname "$0")/run_tiny.sh" "$@" --termination_condition fixed --ngram 1
