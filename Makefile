# Two commands on a fresh machine: `make preview` and `make test`. Both create .venv when missing: `make preview`
# installs what the program needs (requirements.txt), `make test` adds the test and lint tools (requirements-test.txt).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STACK ?= dev
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
# Bytecode is written on first import (also where the environment sets PYTHONDONTWRITEBYTECODE): the first run
# compiles the modules it imports, later runs read them. Not at install: uv's --compile-bytecode compiled every
# module of the provider SDKs (pulumi-gcp's thousands), which was two thirds of the install (docs/measurements.md).
RUN := PYTHONDONTWRITEBYTECODE= $(BIN)/python

.PHONY: help preview golden test examples-check test-user-stacks test-lone-clone test-recipe check-data e2e lint docs gpus bench checkov checkov-workloads checkov-all clean gpu-wheels gpu-check gpu-bench

# uv (from PyPI, pinned) installs requirements.txt in a few seconds where pip took two minutes (README: Speed).
UV_VERSION := 0.13.9

$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(BIN)/uv pip install --quiet --python $(BIN)/python -r requirements.txt
	touch $(STAMP)

$(TEST_STAMP): $(STAMP) requirements-test.txt
	$(BIN)/uv pip install --quiet --python $(BIN)/python -r requirements.txt -r requirements-test.txt
	touch $(TEST_STAMP)

help:  ## every target with what it does and its variables (the `##` text of each)
	@grep -E '^[a-z][a-z-]*:.*## ' $(firstword $(MAKEFILE_LIST)) | sed -E 's/^([a-z-]+):.*## /\1\t/' | expand -t 20

preview: $(STAMP)  ## offline preview of STACK (default dev): no cloud account needed
	$(RUN) -m preview --stack $(STACK) $(if $(BASE),--base $(BASE),)

# tests/golden/: every example stack's preview text, summary.md and registered resources (docs/preview.md, Golden
# previews); tests/test_golden.py diffs them. A refactor leaves them byte-identical; a change that means to change
# the preview rewrites them here and says what changed and why in its commit.
golden: $(STAMP)  ## rewrite tests/golden/ (each example stack's preview and resources) after a change meant to change them
	$(RUN) -m tests.golden_previews

bench: $(STAMP)  ## time the offline preview against the bare Pulumi SDK (each stack; 25/100 generated GPU pools)
	$(RUN) -m preview.bench

# 2 workers (pytest-xdist), tests handed out one by one (--dist load): a module's fixtures may then run on both
# workers, but loadscope's whole-module batches left one worker idle for the last ~8 s (docs/measurements.md).
# Bytecode is written even where the environment sets PYTHONDONTWRITEBYTECODE: later runs skip recompiling.
# The tests that pin an example's values read tests/examples; the Pulumi.*.yaml beside Pulumi.yaml are yours to edit
# and add to (the checks every stack must pass run over each): a stack file that differs is a note, never a failure.
# ruff and lint-imports run beside the tests, while pytest starts its workers (~0.3 s of CPU each, which took ~1 s
# of wall time after the tests); their output follows the tests', and any of the three failing fails the target.
LINT_LOGS := build/.lint
test: $(TEST_STAMP)  ## the whole test suite under Pulumi mocks (2 workers, pytest-xdist), plus ruff and the import contracts
	@mkdir -p $(LINT_LOGS); \
	$(BIN)/ruff check . > $(LINT_LOGS)/ruff.log 2>&1 & ruff=$$!; \
	$(BIN)/lint-imports --no-cache --no-logo > $(LINT_LOGS)/lint-imports.log 2>&1 & imports=$$!; \
	echo "PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n 2 --dist load"; \
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n 2 --dist load; tests=$$?; \
	wait $$ruff; ruff=$$?; echo "$(BIN)/ruff check ."; cat $(LINT_LOGS)/ruff.log; \
	wait $$imports; imports=$$?; echo "$(BIN)/lint-imports --no-cache --no-logo"; cat $(LINT_LOGS)/lint-imports.log; \
	test "$$tests $$ruff $$imports" = "0 0 0" || exit 1; \
	$(BIN)/python tests/user_stacks.py --examples-check --note

examples-check: $(TEST_STAMP)  ## the stack files are still the examples the tests pin (tests/examples); CI runs it
	$(BIN)/python tests/user_stacks.py --examples-check

# A temporary copy with two examples edited and two stack files added, as a user who adapts the stack has it: the
# whole suite passes there, and the checks every stack must pass ran over the added files (CI runs it).
test-user-stacks: $(TEST_STAMP)  ## the suite on a copy with edited example stacks and stack files of a user's own
	$(BIN)/python tests/user_stacks.py

# A user's clone has no ../shared beside it: the suite in a plain temporary copy must pass there too (CI runs it;
# the tests that compare with ../shared/reference skip, the facts they need are in data/ and tests/).
test-lone-clone: $(TEST_STAMP)  ## the suite in a copy of the project with no ../shared beside it, as a user's clone has it
	$(BIN)/python tests/user_stacks.py --lone

# finetune.py's record formats trained on the tiny Llama with the e2e venv's torch and transformers (after make e2e's
# install; skips without it): tests/recipe.
test-recipe: $(TEST_STAMP)  ## each record format trains on a tiny model with the expected labels (the e2e venv's libraries)
	$(BIN)/python -m pytest -m recipe tests/recipe

# The recipe's own data check (finetune.py --check-data, what the launcher runs before the ranks) on your file, here,
# every record read: the format found, the records, each malformed one by its number (a broken JSON line by its
# line), how many are longer than SEQ, and with MODEL the first record as trained, learned tokens in [[...]].
# Without MODEL, formats and fields only, with any python3 (the check is the standard library). With MODEL (a local
# folder, or a Hugging Face id already in this machine's cache: HF_HUB_OFFLINE=1, nothing is downloaded), in make
# e2e's venv when it is there, else in build/check-data-venv (requirements-data-check.txt: transformers, no torch).
# Errors name the variables to change (FINETUNE_STACK_KEYS); a data error exits 2.
CHECK_DATA_VENV := build/check-data-venv
E2E_PYTHON := /opt/ds-e2e-venv/bin/python
CHECK_DATA_PYTHON = $(if $(MODEL),$(if $(wildcard $(E2E_PYTHON)),$(E2E_PYTHON),$(CHECK_DATA_VENV)/bin/python),$(PYTHON))
CHECK_DATA_KEYS := {"--dataset": "DATA", "--model": "MODEL", "--records": "FORMAT", "--seq-len": "SEQ"}
# finetune.sequenceLength's default (model/schema.yaml; tests/test_check_data.py holds them equal)
SEQ_DEFAULT := 2048

$(CHECK_DATA_VENV)/.installed: requirements-data-check.txt
	test -x $(CHECK_DATA_VENV)/bin/python || $(PYTHON) -m venv $(CHECK_DATA_VENV)
	$(CHECK_DATA_VENV)/bin/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(CHECK_DATA_VENV)/bin/uv pip install --quiet --python $(CHECK_DATA_VENV)/bin/python -r requirements-data-check.txt
	touch $@

check-data: $(if $(MODEL),$(if $(wildcard $(E2E_PYTHON)),,$(CHECK_DATA_VENV)/.installed),)  ## check a fine-tune data file before the cluster: make check-data DATA=file.jsonl [MODEL=local-folder|cached-hub-id] [FORMAT=messages|prompt-completion|alpaca|sharegpt|text] [SEQ=2048] [ARGS=--roles bot=assistant]
	@test -n "$(DATA)" || { echo "error: give the file: make check-data DATA=train.jsonl [MODEL=...] [FORMAT=...]" >&2; exit 2; }
	@HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error FINETUNE_STACK_KEYS='$(CHECK_DATA_KEYS)' \
		$(CHECK_DATA_PYTHON) recipes/finetune.py --check-data --check-records 0 --dataset "$(DATA)" \
		$(if $(MODEL),--model "$(MODEL)",) $(if $(FORMAT),--records "$(FORMAT)",) --seq-len "$(or $(SEQ),$(SEQ_DEFAULT))" $(ARGS)

# Needs root (network namespaces); skips with the reason elsewhere. e2e/install.sh installs once (apt: openssh,
# pdsh, openmpi; a CPU torch + DeepSpeed venv at /opt/ds-e2e-venv) and returns at once afterwards.
e2e: $(STAMP)  ## DeepSpeed's launch paths and preemption recovery across network-namespace hosts, on CPU
	@if $(BIN)/python e2e/run.py --preflight; then bash e2e/install.sh && $(BIN)/python e2e/run.py; fi

# The GPU path on a lent device machine (issue 27.5; docs/measurements.md "GPU check"): gpu-wheels fills
# build/gpu-wheels/ here (deepspeed's sdist, datasets and the wheels data/gpu_check.yaml names, 5.5 MiB; the stack's
# ds_config.json); gpu-check runs there, with build/gpu-wheels carried: finetune.py in bf16 under ZeRO-3 with LoRA on
# one GPU, exports reloaded and compared by greedy tokens. ARGS=--cpu runs it on CPUs (PYTHON= a python with torch);
# ARGS=--packing trains padding-free and first checks that the flattened records' logits equal each one's own.
gpu-wheels: $(STAMP)  ## fill build/gpu-wheels/ for make gpu-check on a device machine (run here, with network)
	$(BIN)/python e2e/gpu_wheels.py

gpu-check:  ## on a device machine: finetune.py bf16 ZeRO-3 LoRA on one GPU, exports compared (needs make gpu-wheels)
	bash e2e/gpu_check.sh $(ARGS)

# This stack's own throughput rows (issue 37 item 2; data/training_speed.yaml `throughput`, `ours: true`):
# finetune.py on Llama-3.2-1B and Qwen2.5-7B shapes at random weights, ZeRO-2/3, full and LoRA, sequence 2048, bf16,
# micro batch 1 and the largest that fits; one JSON line per setting. ARGS=--quick: the 1B shape at micro batch 1.
gpu-bench:  ## on a device machine: tokens/s per GPU, MFU and peak memory per setting (needs make gpu-wheels)
	GPU_CHECK_SCRIPT=e2e/gpu_bench.py bash e2e/gpu_check.sh $(ARGS)

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache --no-logo

docs: $(STAMP)  ## regenerate the configuration reference (docs/reference.md) from model/schema.yaml
	$(BIN)/python -m model.docs --write docs/reference.md

# WRITE=<stack>: write the cheapest plan the stack's checks accept (within BUDGET $/h) as Pulumi.<stack>.yaml;
# SERVE=0|1: without or with the server of the result (MODE=finetune: with, by default); FORCE=1 replaces the file.
# GPUS=16xH100-MEGA (or 2xa3-megagpu-8g): plan on the capacity you hold only; TOP=n: options per table (not with WRITE).
# DEEPSPEED_STACK_MAKE=1: the programs name arguments as these variables (BUDGET=, not --budget) in their errors.
gpus: $(STAMP)  ## cheapest GPUs that hold a model: make gpus MODEL=Qwen2.5-7B-Instruct|7B MODE=inference|training|finetune [PRECISION=fp16] [REGION=...] [GPUS=16xH100-MEGA] [RESERVATION=name:2xa3-megagpu-8g:2026-12-04T00:00Z] [RANK=cost|speed] [TOP=n] [VOCAB=.. HIDDEN=..|LARGEST=..] [TOKENS=N|DATA=file.jsonl [FIELDS=a,b]] [EPOCHS=n] [RUNS=<folder of run.json>] [WRITE=<stack> [BUDGET=$/h] [SERVE=0|1] [FORCE=1]]
	DEEPSPEED_STACK_MAKE=1 $(RUN) -m $(if $(WRITE),preview.write_stack --stack "$(WRITE)" \
		$(if $(BUDGET),--budget "$(BUDGET)",) $(if $(SERVE),--serve "$(SERVE)",) $(if $(filter-out 0,$(FORCE)),--force,),planner) \
		$(if $(MODEL),--model "$(MODEL)",$(if $(PARAMETERS),--parameters $(PARAMETERS),)) \
		$(if $(MODE),--mode $(MODE),) $(if $(PRECISION),--precision $(PRECISION),) \
		$(if $(REGION),--region $(REGION),) $(if $(SEQ),--seq $(SEQ),) $(if $(BATCH),--batch $(BATCH),) \
		$(if $(VOCAB),--vocab $(VOCAB),) $(if $(HIDDEN),--hidden $(HIDDEN),) $(if $(LARGEST),--largest-layer $(LARGEST),) \
		$(if $(TOKENS),--tokens $(TOKENS),) $(if $(DATA),--data "$(DATA)",) $(if $(FIELDS),--fields "$(FIELDS)",) \
		$(if $(EPOCHS),--epochs $(EPOCHS),) $(if $(GPUS),--gpus "$(GPUS)",) $(if $(WRITE),,$(if $(TOP),--top $(TOP),)) \
		$(if $(RESERVATION),--reservation "$(RESERVATION)",) $(if $(RANK),--rank $(RANK),) \
		$(if $(WRITE),,$(if $(RUNS),--runs "$(RUNS)",))

# checkov lives in a venv of its own (it pins many packages of its own); not part of requirements.txt.
CHECKOV_VENV ?= /tmp/checkov-venv
CHECKOV_VERSION := 3.3.30
CHECKOV := $(CHECKOV_VENV)/bin/checkov
$(CHECKOV):
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet checkov==$(CHECKOV_VERSION)

checkov-workloads: preview $(CHECKOV)  ## checkov's Kubernetes checks on STACK's manifests and the MPIJobs' pods (waivers skipped)
	BC_SKIP_MAPPING=TRUE $(CHECKOV) -d build/$(STACK) --framework kubernetes --compact --quiet

checkov: checkov-workloads  ## checkov-workloads, and checkov's GCP checks on STACK's resources (waivers skipped)
	$(BIN)/python -m preview.tfplan --stack $(STACK)
	BC_SKIP_MAPPING=TRUE $(CHECKOV_VENV)/bin/checkov -f build/$(STACK)/tfplan.json --framework terraform_plan \
		--compact --quiet --skip-check $(GCP_WAIVED)

# checkov's GCP checks waived, each for the reason in README (Policy pack, checkov's GCP checks).
GCP_WAIVED := CKV_GCP_12,CKV_GCP_65,CKV_GCP_66,CKV_GCP_84

# Every stack's workloads (each Pulumi.*.yaml; all of them are checked, then it fails if one did), and the GCP
# checks on prod, the stack they are held to (README, Policy pack).
checkov-all: $(STAMP) $(CHECKOV)  ## checkov-workloads on every Pulumi.*.yaml, and checkov on prod (CI runs it)
	@failed=""; for file in Pulumi.*.yaml; do stack=$${file#Pulumi.}; stack=$${stack%.yaml}; \
		echo "== checkov-workloads STACK=$$stack"; \
		$(MAKE) --no-print-directory checkov-workloads STACK="$$stack" || failed="$$failed $$stack"; \
	done; \
	echo "== checkov STACK=prod"; $(MAKE) --no-print-directory checkov STACK=prod || failed="$$failed prod(GCP)"; \
	if [ -n "$$failed" ]; then echo "checkov failed on:$$failed" >&2; exit 1; fi

clean:
	rm -rf build .pytest_cache .ruff_cache
