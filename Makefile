# Two commands on a fresh machine:  make demo  |  make test
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= output/demo
export OMP_NUM_THREADS ?= 2
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export DS_ACCELERATOR ?= cpu

.PHONY: demo test lint install clean

$(VENV)/.installed: requirements.txt pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m marlhf.demo --output_dir $(OUT) $(ARGS)

test: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) -m pytest -q $(ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check marlhf tests benchmarks inference evaluation scripts
	$(VENV)/bin/ruff format --check marlhf tests benchmarks inference evaluation scripts

clean:
	rm -rf output
