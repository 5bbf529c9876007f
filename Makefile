# Every target sets up what it needs: the active virtualenv if there is one, else ./.venv.
# Setup is re-run only when pyproject.toml/setup.py change (a stamp file), so targets are safe to run twice.
ENV_DIR := $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV),$(CURDIR)/.venv)
PY := $(ENV_DIR)/bin/python
STAMP := $(ENV_DIR)/.kfp-finetune-setup
# torch exactly: a CPU wheel for 2.13.0 lies on local disk, while an unpinned torch pulls a CUDA build.
TORCH_VERSION ?= 2.13.0
# The installer `make setup` uses (tools/uv_install.py).
UV_VERSION ?= 0.13.8
PYTEST_ARGS ?=
# Test worker processes (pytest-xdist). Most tests keep one core busy (a kfp.local step, a torchtune run of a tiny
# model), so two workers halve the suite's time on two cores; each test file runs whole in one worker, where its
# module- and session-scoped fixtures are built once. The longest files go first (LONGEST_FILES, tests/conftest.py).
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
# The trainer image's stack (extras train + lm-eval): lm-eval needs transformers<5, so huggingface_hub<1 and an
# older datasets than the main environment gets (pyproject.toml). It lives in a second environment, where the
# tests of what that stack changes run again: evaluation (lm-eval tasks, transformers 4), export and storage
# (huggingface_hub 0.x), training with every method and every tiny family once (the datasets torchtune reads
# with), every family's logit parity with transformers 4 (test_parity.py), the Qwen3, Gemma 3, SmolLM2 and Mistral-Nemo
# builders' logits against transformers 4's (users load exports with either) and the tokenizer.json tokenizer
# against transformers 4's tokenizers and chat templates.
# The rest of test_training.py (loss curves, process handling) does not touch those versions.
LM_EVAL_ENV_DIR := $(CURDIR)/.venv-lm-eval
LM_EVAL_PY := $(LM_EVAL_ENV_DIR)/bin/python
LM_EVAL_STAMP := $(LM_EVAL_ENV_DIR)/.kfp-finetune-setup
LM_EVAL_TRAINING := $(foreach case,lora-gemma3 lora-smollm2 lora-mistral_nemo dora-qwen2_5 qlora-qwen3,'tests/components/torchtune_finetune/test_training.py::test_every_method_trains_and_writes_its_checkpoint[$(case)]') \
	'tests/components/torchtune_finetune/test_training.py::test_loss_falls_on_the_synthetic_task[llama3_2-full-0.5]'
# The families' compile, FSDP2 and block-mask tests compare torchtune's modules with themselves (transformers only
# writes the random model they load): torch, torchao and torchtune are the same in both environments, so they run
# in the main one only.
LM_EVAL_DESELECT := $(foreach test,gemma3.py::test_a_packed_cuda_run_s_model_computes_packs_through_compiled_flex_attention \
	gemma3.py::test_activation_checkpointing_fsdp2_and_per_layer_compile_keep_the_logits_and_gradients \
	gemma3.py::test_a_packed_blockmask_is_narrowed_to_the_window_once_per_batch \
	qwen3.py::test_activation_checkpointing_fsdp2_and_per_layer_compile_keep_the_logits_and_gradients, \
	--deselect tests/components/_shared/torchtune/families/test_$(test))
LM_EVAL_TESTS ?= $(LM_EVAL_DESELECT) $(LM_EVAL_TRAINING) tests/components/evaluate/test_evaluate.py tests/components/export/test_export.py tests/components/_shared/test_storage.py tests/components/_shared/torchtune/test_parity.py tests/components/_shared/torchtune/families/test_qwen3.py tests/components/_shared/torchtune/families/test_gemma3.py tests/components/_shared/torchtune/families/test_smollm2.py tests/components/_shared/torchtune/families/test_mistral_nemo.py tests/components/_shared/torchtune/test_hf_tokenizer.py
# transformers-engine needs transformers 5, which the lm-eval environment cannot have (pyproject.toml); gpu
# (bitsandbytes, which quantizes on the CPU too) is what the transformers engine's QLoRA tests train with;
# lm-eval-transformers is the lm-eval that engine's evaluation scores tasks with (beside transformers 5).
MAIN_EXTRAS := train,test,transformers-engine,tracking-server,registry,gpu,lm-eval-transformers
LM_EVAL_EXTRAS := train,test,lm-eval

# $(call make-env,<env dir>,<extras>): a virtualenv with pip and uv, then torch and kfp-finetune (editable) with the
# extras in one uv resolve: uv installs in parallel, a few times faster than pip, from the sources pip is configured
# with (tools/uv_install.py), so it takes the same packages (the CPU torch a local wheel folder holds, say). It then
# byte-compiles the environment, as pip would: where PYTHONDONTWRITEBYTECODE is set, no process writes bytecode, and
# each of the suite's thousand-odd Python processes would compile everything it imports from source.
define make-env
	@test -x $(1)/bin/python || python3 -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip uv==$(UV_VERSION)
	$(1)/bin/python tools/uv_install.py --quiet torch==$(TORCH_VERSION) -e '.[$(2)]'
	@touch $(1)/.kfp-finetune-setup
endef

.PHONY: setup setup-lm-eval demo test test-quick test-lm-eval lint format compile check-compiled

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py tools/uv_install.py
	$(call make-env,$(ENV_DIR),$(MAIN_EXTRAS))

setup-lm-eval: $(LM_EVAL_STAMP)

$(LM_EVAL_STAMP): pyproject.toml setup.py tools/uv_install.py
	$(call make-env,$(LM_EVAL_ENV_DIR),$(LM_EVAL_EXTRAS))

demo: setup
	HF_HUB_OFFLINE=1 $(PY) -m kfp_finetune.cli demo --output demo_output

# The lm-eval environment's tests run in one more process beside the main suite's workers, so the cores stay busy
# while the main suite's last files finish alone; their output (also in LM_EVAL_LOG) follows the main suite's.
LM_EVAL_LOG := $(LM_EVAL_ENV_DIR)/test.log
test: setup setup-lm-eval lint check-compiled
	@$(LM_EVAL_PYTEST) -p no:cacheprovider $(LM_EVAL_TESTS) > $(LM_EVAL_LOG) 2>&1 & lm_eval_pid=$$!; \
	echo "the lm-eval environment's tests run beside these, output in $(LM_EVAL_LOG)"; \
	HF_HUB_OFFLINE=1 $(PY) -m pytest $(XDIST) $(PYTEST_ARGS); main=$$?; \
	wait $$lm_eval_pid; lm_eval=$$?; \
	echo "--- the lm-eval environment's tests ($(LM_EVAL_ENV_DIR)):"; cat $(LM_EVAL_LOG); \
	test $$main -eq 0 && test $$lm_eval -eq 0

# The inner loop (under 5 minutes on 2 cores): lint, the compiled-YAML check and every test not marked slow (none
# that takes over a second: no real torchtune training, no kfp.local run). `make test` runs everything.
test-quick: setup lint check-compiled
	HF_HUB_OFFLINE=1 $(PY) -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

# KFP_FINETUNE_REQUIRE_LM_EVAL: the lm-eval test fails here instead of skipping when lm-eval does not import.
# One torch thread per process, as each of two workers on two cores gets (tests/conftest.py).
LM_EVAL_PYTEST := HF_HUB_OFFLINE=1 KFP_FINETUNE_REQUIRE_LM_EVAL=1 OMP_NUM_THREADS=1 $(LM_EVAL_PY) -m pytest
test-lm-eval: setup-lm-eval
	$(LM_EVAL_PYTEST) $(XDIST) $(LM_EVAL_TESTS)

compile: setup
	$(PY) -m kfp_finetune.cli compile --output compiled

check-compiled: setup
	$(PY) -m kfp_finetune.cli compile --check --output compiled

# The import rule (a component imports only _shared and itself; _shared no component): an ast walk, no imports run.
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q -p no:cacheprovider tests/components/test_import_rule.py

format: setup
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# Container images (images/README.md). Tags: $(IMAGE_REGISTRY)/kfp-finetune-{component,trainer,trainer-transformers}:
# <package version>, the names the components and runtimes use by default. Set IMAGE_REGISTRY to your registry,
# then push the tags and compile with KFP_FINETUNE_{COMPONENT,TRAINER,TRANSFORMERS_TRAINER}_IMAGE set to them.
IMAGE_REGISTRY ?= ghcr.io/kfp-finetune
IMAGE_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
CONTAINER_ENGINE ?= $(if $(shell command -v docker),docker,podman)
# The transformers engine's trainer: its extra (transformers 5, TRL, PEFT) and the lm-eval that runs beside
# transformers 5, in place of the lm-eval extra's (transformers 4).
TRANSFORMERS_TRAINER_EXTRAS ?= train,gpu,parity,transformers-engine,tracking,lm-eval-transformers
IMAGE_BUILD_ARGS ?=

.PHONY: images
images:
	$(CONTAINER_ENGINE) build $(IMAGE_BUILD_ARGS) -f images/component/Dockerfile -t $(IMAGE_REGISTRY)/kfp-finetune-component:$(IMAGE_TAG) .
	$(CONTAINER_ENGINE) build $(IMAGE_BUILD_ARGS) -f images/trainer/Dockerfile -t $(IMAGE_REGISTRY)/kfp-finetune-trainer:$(IMAGE_TAG) .
	$(CONTAINER_ENGINE) build --build-arg EXTRAS=$(TRANSFORMERS_TRAINER_EXTRAS) $(IMAGE_BUILD_ARGS) -f images/trainer/Dockerfile -t $(IMAGE_REGISTRY)/kfp-finetune-trainer-transformers:$(IMAGE_TAG) .

# Benchmarks (benchmarks/README.md): measurements, not tests, so not part of `make test`. Options go in BENCH_ARGS,
# e.g. `make bench BENCH_ARGS="--quick"` or `BENCH_ARGS="--only launcher,peer --repeats 5 --max-load 1.0"`.
BENCH_ARGS ?=
BENCH_STAMP := $(ENV_DIR)/.kfp-finetune-bench

.PHONY: bench
bench: setup $(BENCH_STAMP)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m benchmarks.run $(BENCH_ARGS)

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e '.[train,test,bench]'
	@touch $(BENCH_STAMP)
