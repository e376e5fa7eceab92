#!/bin/bash
# The GPU acceptance run in one script (docs/gpu.md): the CUDA tests, the benchmark parts, then the
# pipeline, each under its own time limit so that a slow part cannot take the others' time.
#
#   bash scripts/gpu_acceptance.sh OUTPUT_DIR [WHEEL_DIR]
#
# WHEEL_DIR: wheels to install first into /tmp/marlhf-site (a machine without network; see
# docs/gpu.md, "Preparing a bare GPU machine"). STEPS picks what runs (default "tests bench
# pipeline"); limits in seconds: TESTS_S (120), BENCH_S (330), PIPELINE_S (240); PIPELINE_SIZE
# (512x4) is the pipeline model's --size. Writes OUTPUT_DIR/tests.log, bench.{log,json,md},
# pipeline.{log,json,md} and logs.tgz (every process's log).
set -u
out=${1:?usage: bash scripts/gpu_acceptance.sh OUTPUT_DIR [WHEEL_DIR]}
wheels=${2:-}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}  # 9.0a breaks DeepSpeed's op builder
unset DS_ACCELERATOR
t0=$(date +%s)
if [ -n "$wheels" ]; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/marlhf-site "$wheels"/*.whl || { echo "error: installing $wheels failed"; exit 2; }
    export PYTHONPATH=/tmp/marlhf-site:$PWD
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
$py - <<'PY' || { echo "error: the imports above failed (missing packages?)"; exit 2; }
import importlib
for name in ("torch", "transformers", "deepspeed", "datasets", "peft", "pyarrow", "triton"):
    try:
        print(name, importlib.import_module(name).__version__)
    except ImportError as e:
        print(name, "missing:", e)
import torch
import marlhf.gpu_check  # noqa: F401
import marlhf.stages.ppo  # noqa: F401
print("GPU:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU size)")
PY
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }
steps=" ${STEPS:-tests bench pipeline} "
if [[ $steps == *" tests "* ]]; then
    timeout -k 10 "${TESTS_S:-120}" $py -m pytest -q -m cuda -p no:cacheprovider tests \
        > "$out/tests.log" 2>&1
    echo "cuda tests: exit $? at $(elapsed): $(tail -n 1 "$out/tests.log")"
fi
run_part() {  # name, limit, gpu_check arguments...
    local name=$1 limit=$2; shift 2
    timeout -k 10 "$limit" $py -m marlhf.gpu_check "$@" --stage_timeout_s "$limit" \
        --output_dir "/tmp/marlhf-gpu-check/$name" > "$out/$name.log" 2>&1
    echo "$name: exit $? at $(elapsed)"
    for ext in json md; do
        cp "/tmp/marlhf-gpu-check/$name/gpu_check.$ext" "$out/$name.$ext" 2>/dev/null
    done
    cat "$out/$name.md" 2>/dev/null
}
if [[ $steps == *" bench "* ]]; then
    run_part bench "${BENCH_S:-330}" --parts environment ppo_update decode mismatch
fi
if [[ $steps == *" pipeline "* ]]; then
    run_part pipeline "${PIPELINE_S:-240}" --parts pipeline --size "${PIPELINE_SIZE:-512x4}"
fi
(cd /tmp && find marlhf-gpu-check 2>/dev/null \( -path '*/logs/*' -o -name metrics.jsonl \) -type f -print0 \
    | tar czf "$out/logs.tgz" --null -T -)
echo "done at $(elapsed): $out"
