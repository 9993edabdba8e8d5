# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml | cksum | cut -d' ' -f1)

PARTS := costmodel envs policies runtime experiments

.PHONY: demo test test-slow lint install bench clean

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
	@# torch first, alone and pinned: anything else may pull a multi-GB CUDA build.
	$(BIN)/python -m pip install -q "$$(grep -E '^torch==' requirements.lock)"
	$(BIN)/python -m pip install -q -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps -e .
	@$(MAKE) -s links
	@rm -f $(VENV)/.installed-*
	@touch $@

# The parts live in top-level folders (hetpart.costmodel = costmodel/); import-linter reads one package
# folder, so hetpart/<part> links to ../<part> (ignored by git; Python imports the same files either way).
.PHONY: links
links:
	@for p in $(PARTS); do ln -sfn ../$$p hetpart/$$p; done

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/hetpart demo

# `make test`: every test not marked slow, spread over the cores (pytest-xdist; under 10 minutes on 2 cores).
# `make test-slow`: the slow ones (multi-process runs: the runtime, the loop, calibration, the browser), one at a
# time, since each already uses several processes. CI (.ci/run) runs both.
test: lint
	$(BIN)/python -m pytest tests -m "not slow" -n auto

test-slow: $(STAMP) links
	$(BIN)/python -m pytest tests -m slow

# The import layers (pyproject.toml [tool.importlinter]) and ruff, before any test runs.
lint: $(STAMP) links
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# Rerun benchmarks and rewrite their blocks of docs/BENCHMARKS.md: the quick ones by default,
# or the named ones (make bench BENCH="planners scaling"; run_all --list names them all).
bench: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m hetpart.experiments.run_all $(BENCH)

clean:
	rm -rf $(VENV) build *.egg-info
