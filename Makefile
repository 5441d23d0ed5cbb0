# PowerGuard developer commands. Everything runs from ./.venv, which `make venv` creates.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
STAMP  := $(VENV)/.installed

PROJECTS := -e ./schemas -e ./bus[embedded,otlp] -e ./snmp -e ./services/ups-monitor -e ./services/coordinator \
            -e ./services/power-control -e ./services/ckpt-agent[lightning,hf,s3] -e .
PYPROJECTS := pyproject.toml schemas/pyproject.toml bus/pyproject.toml snmp/pyproject.toml $(wildcard services/*/pyproject.toml) \
              constraints.txt requirements-dev.txt VERSION

.PHONY: venv test test-full test-unit demo bench chaos schemas lint fmt clean help wheels lock

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

venv: $(STAMP)  ## create .venv with every project (editable) and the dev tools

$(STAMP): $(PYPROJECTS)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "PowerGuard needs Python 3.11+")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt $(PROJECTS) -r requirements-dev.txt
	touch $(STAMP)

test: venv  ## run the whole test suite (unit, integration against real peers, e2e)
	$(BIN)/pytest

test-full: venv  ## the whole suite and the second paths CI skips for time (@pytest.mark.full: each names the CI test covering it)
	PG_FULL=1 $(BIN)/pytest

test-unit: venv  ## only the fast unit tests
	$(BIN)/pytest tests/unit

demo: venv  ## outage drill on this machine: embedded NATS + simulated site
	$(BIN)/powerguard demo --json demo-output/report.json

bench: venv  ## run the benchmarks; figures land in bench/results/
	@for b in bench/saga.py bench/detection.py bench/upsmon_side_by_side.py bench/checkpoint.py bench/power_checkpoint.py bench/node_tier.py bench/gpu_checkpoint.py bench/step_boundary.py bench/sharded_step.py bench/framework_callbacks.py bench/alerting.py bench/ramp.py bench/scale.py bench/fanout.py bench/consumer_path.py bench/registrations.py bench/isolation.py bench/drill.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done
	$(BIN)/python bench/report.py

chaos: venv  ## the randomized fault campaign: 100 outage drills with faults (~2 h; CHAOS_ARGS=--merge adds a sitting); bench/results/chaos.json
	$(BIN)/python bench/chaos.py --runs $(or $(RUNS),100) --seed $(or $(SEED),1) --keep chaos-failed $(CHAOS_ARGS)

schemas: venv  ## regenerate schemas/generated (JSON Schema, AsyncAPI, catalogue)
	$(BIN)/powerguard schemas export schemas/generated
	cp schemas/generated/events.md docs/events.md

lint: venv  ## ruff
	$(BIN)/ruff check .
	$(BIN)/ruff format --check schemas services src tests bench

fmt: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format schemas services src tests bench

wheels:  ## PowerGuard's wheels (no venv needed: python3 with pip; hatchling comes through pip's build isolation): dist/wheels for management hosts (docs/deploy-bare-metal.md), dist/agent-wheels (the ckpt-agent) for compute nodes
	rm -rf dist/wheels dist/agent-wheels
	$(PYTHON) -m pip wheel -q --no-deps -w dist/wheels ./schemas ./bus ./snmp ./services/ups-monitor ./services/coordinator \
	    ./services/power-control .
	$(PYTHON) -m pip wheel -q --no-deps -w dist/agent-wheels ./services/ckpt-agent
	cp packaging/locks/management.txt dist/wheels/constraints.txt
	cp packaging/locks/agent.txt dist/agent-wheels/constraints.txt
	@ls dist/wheels dist/agent-wheels

lock: venv  ## after a dependency changed: constraints.txt (dev and CI) and packaging/locks/ (management host, agent) from .venv
	$(BIN)/python packaging/lock.py write

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
