# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test install bench clean

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
	@# torch first, alone and pinned: anything else may pull a multi-GB CUDA build.
	$(BIN)/python -m pip install -q "$$(grep -E '^torch==' requirements.lock)"
	$(BIN)/python -m pip install -q -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps -e .
	@rm -f $(VENV)/.installed-*
	@touch $@

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/hetpart demo

test: $(STAMP)
	$(BIN)/python -m pytest tests

bench: $(STAMP)
	$(BIN)/python -m hetpart.experiments.run_all

clean:
	rm -rf $(VENV) build *.egg-info
