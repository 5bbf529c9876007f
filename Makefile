# Every target sets up what it needs: the active virtualenv if there is one, else ./.venv.
# Setup is re-run only when pyproject.toml/setup.py change (a stamp file), so targets are safe to run twice.
ENV_DIR := $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV),$(CURDIR)/.venv)
PY := $(ENV_DIR)/bin/python
STAMP := $(ENV_DIR)/.kfp-finetune-setup
# torch first and exactly: a CPU wheel for 2.13.0 lies on local disk, while an unpinned torch pulls a CUDA build.
TORCH_VERSION ?= 2.13.0
PYTEST_ARGS ?=

.PHONY: setup demo test lint format compile check-compiled

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py
	@test -x $(PY) || python3 -m venv $(ENV_DIR)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -e '.[train,test]'
	@touch $(STAMP)

demo: setup
	HF_HUB_OFFLINE=1 $(PY) -m kfp_finetune.cli demo --output demo_output

test: setup lint
	HF_HUB_OFFLINE=1 $(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: setup
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .
