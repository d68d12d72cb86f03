# The two commands from the README:  `make demo`  and  `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install install-dev demo test lint

$(VENV)/.installed: pyproject.toml scripts/install.sh
	bash scripts/install.sh $(VENV) dev
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/jaxcore demo

lint: install
	$(VENV)/bin/ruff check .

test: lint
	$(PY) -m pytest -n 2 -q --durations=15
