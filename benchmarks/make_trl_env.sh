#!/usr/bin/env bash
# Builds .venv-trl: TRL's GRPOTrainer in its own virtual environment, for benchmarks/trl_grpo.py
# (a peer's GRPO on the project's synthetic tasks). It needs nothing of the project's .venv:
# torch (the CPU wheel), trl and the transformers/datasets/accelerate releases trl accepts with
# the bundled tiny models, and the project itself without dependencies (its data and gold scorers).
#   bash benchmarks/make_trl_env.sh        (or: make trl-env)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TRL_VENV:-.venv-trl}
TRL_VERSION=${TRL_VERSION:-1.13.0}
# the releases checked with trl 1.13.0 and the bundled tiny models (benchmarks/trl_grpo.py --check)
TRANSFORMERS_VERSION=${TRL_TRANSFORMERS_VERSION:-5.23.0}
test -x "$VENV/bin/python" || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q torch==2.13.0
"$VENV/bin/python" -m pip install -q "trl==$TRL_VERSION" "transformers==$TRANSFORMERS_VERSION" \
    datasets==5.2.0 accelerate==1.15.0 matplotlib requests
"$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
"$VENV/bin/python" -c "import trl, transformers; print('trl', trl.__version__, 'transformers', transformers.__version__)"
