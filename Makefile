# Two commands do all the set-up: `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of torch lies on this machine's disk under this exact version; on a GPU machine the
# same pin gives the ordinary CUDA build. Override with `make TORCH_SPEC=torch==X.Y ...`.
TORCH_SPEC ?= torch==2.13.0
STAMP  := $(VENV)/.ditty-installed

.PHONY: setup demo lint test test-quick clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ditty run tiny_sft

# ruff (check and format, line length 120: see pyproject.toml) runs first: a lint error fails CI fast.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(PY) -m pytest -n 2 --dist loadgroup -q

test-quick: $(STAMP)
	$(PY) -m pytest -n 2 -q -m "not slow"

clean:
	rm -rf $(VENV) runs .pytest_cache
