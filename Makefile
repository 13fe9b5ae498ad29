# Parallel PyTorch - the two commands a student needs:
#   make lab        create .venv if missing, install, start JupyterLab on 127.0.0.1 with a token
#   make test       create .venv if missing, install, run the whole test suite (as CI: on the CPU)
# On a machine with NVIDIA GPUs, also (neither installs anything: the .venv, or PYTHON=...):
#   make gpu-check  is this node ready? every GPU lane it can run, one table (tools/gpu_check.py)
#   make test-gpu   only the GPU tests (nccl, cuda): they skip, saying why, without enough GPUs
# Everything else here is for authors and instructors:
#   make site       the course as a website that works offline: build/site/index.html
#   make grade      the labs as an nbgrader course in build/grading: generate the student versions,
#                   autograde the submissions in SUBMISSIONS (default: a demo, each solution and each
#                   lab untouched) with the labs' check cells as tests, and write HTML feedback
#                   (make grade SUBMISSIONS=dir LABS="lab02_manual_data_parallel ..."; tools/grade.py)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The instructor tools (nbgrader; pyproject's optional group `instructor`), in the same venv.
INSTRUCTOR := $(VENV)/.installed-instructor
# Notebooks call `!torchrun`: make the venv's tools the ones found first.
export PATH := $(abspath $(BIN)):$(PATH)
# Keep the course's pip quiet about its own version; never ask questions.
export PIP_DISABLE_PIP_VERSION_CHECK := 1

# make test-gpu and make gpu-check install nothing (a GPU node may have no network): the course's
# .venv if there is one, else PYTHON (make gpu-check PYTHON=python3: the node's own torch), with
# the course's package taken from src/.
NODE_PYTHON := $(if $(filter command line environment,$(origin PYTHON)),$(PYTHON),$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)))
NODE_ENV := PYTHONPATH=$(CURDIR)/src$${PYTHONPATH:+:$$PYTHONPATH}

.PHONY: lab test test-gpu gpu-check slides site labs grade scripts outputs check-python clean help

help:
	@sed -n '2,13p' Makefile

check-python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null || { \
	  echo "error: Parallel PyTorch needs Python 3.11 or newer, but '$(PYTHON)' is: $$($(PYTHON) --version 2>&1 || echo 'not found')."; \
	  echo "       Install a newer Python and run: make PYTHON=/path/to/python3.11 $(MAKECMDGOALS)"; exit 1; }

$(BIN)/python: | check-python
	$(PYTHON) -m venv $(VENV)

# Re-install whenever the dependency list changes.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	@# No "news" toast over the first notebook: set in the course's environment, not in $$HOME.
	@$(BIN)/jupyter labextension disable --level=sys_prefix \
	  @jupyterlab/apputils-extension:announcements >/dev/null 2>&1
	@touch $@

# make test and the instructor targets: the course plus the instructor group. nbgrader brings its
# JupyterLab menus and server extensions, and the notebook package its "open in" buttons: all off
# in the course's environment, so that make lab shows a student the same JupyterLab either way.
# An instructor who wants nbgrader's formgrader turns them on (README: grading the labs).
$(INSTRUCTOR): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[instructor]'
	@# Their chatter only when they fail.
	@out=$$($(BIN)/jupyter labextension disable --level=sys_prefix @jupyter/nbgrader \
	  @jupyter-notebook/lab-extension 2>&1) || { echo "$$out"; exit 1; }
	@out=$$($(BIN)/jupyter server extension disable --sys-prefix nbgrader.server_extensions.formgrader \
	  nbgrader.server_extensions.assignment_list nbgrader.server_extensions.course_list \
	  nbgrader.server_extensions.validate_assignment 2>&1) || { echo "$$out"; exit 1; }
	@touch $@

lab: $(STAMP)
	@TOKEN=$$($(BIN)/python -c 'import secrets; print(secrets.token_hex(24))'); \
	PORT=$$($(BIN)/python -c 'import socket; s = socket.socket(); \
	  ports = [p for p in range(8888, 8988) if s.connect_ex(("127.0.0.1", p)) != 0]; print(ports[0])'); \
	ROOT=$$([ "$$(id -u)" = 0 ] && echo --allow-root); \
	echo; echo "    Open: http://127.0.0.1:$$PORT/lab/tree/notebooks/00_setup_check.ipynb?token=$$TOKEN"; echo; \
	$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.port=$$PORT --ServerApp.port_retries=0 \
	  --IdentityProvider.token=$$TOKEN $$ROOT --KernelManager.transport_encryption=auto \
	  --ServerApp.root_dir=$(CURDIR) --LabApp.default_url=/lab/tree/notebooks/00_setup_check.ipynb

# Two workers (pytest-xdist): tests/harness/units_of_work.py says how the work is split and why;
# --no-loadscope-reorder keeps the order it hands the work out in (cheap first). As CI runs it, on
# a GPU node too: the GPUs hidden (the stored outputs are CPU runs, compared strictly), and without
# the gpu lane (make test-gpu runs it alone; its unmarked guards run here).
test: $(INSTRUCTOR)
	CUDA_VISIBLE_DEVICES= $(BIN)/python -m pytest -n auto --no-loadscope-reorder -m "not gpu"

# The nccl paths the CPU suite cannot reach (tests/gpu/test_gpu.py; -rs prints why a test skipped),
# alone, one test at a time, without the suite's nbval options (the lane runs notebooks itself, and
# a node's Python may have no nbval). PYTEST_ARGS selects parts, e.g. make test-gpu PYTEST_ARGS="-k notebook".
test-gpu:
	$(NODE_ENV) $(NODE_PYTHON) -m pytest -o addopts= -p no:cacheprovider -p no:xdist -m gpu tests/gpu/test_gpu.py \
	  -v -rs $(PYTEST_ARGS)

# Instructors, on a GPU node: every GPU lane the node can run within about 8 minutes on one GPU,
# the others skipped with the reason; one table, and build/gpu-check.json (GPU_CHECK_ARGS="--budget 900").
gpu-check:
	$(NODE_ENV) $(NODE_PYTHON) tools/gpu_check.py $(GPU_CHECK_ARGS)

# Instructors: every lecture notebook as an offline reveal.js deck in build/slides/
# (reveal.js and MathJax come from the npm registry once; the decks then need no network).
slides: $(STAMP)
	$(BIN)/python tools/make_slides.py
	@echo "Open build/slides/index.html in a browser."

# Everyone: the course as a static website in build/site/ (lectures with their outputs, labs,
# MISTAKES, the decks), readable offline and ready for any static web server.
site: $(STAMP)
	$(BIN)/python tools/make_site.py

# Authors: regenerate labs/ from solutions/ with nbgrader's generate step (tests fail when they drift).
labs: $(INSTRUCTOR)
	$(BIN)/python tools/make_labs.py

# Instructors: see the top of this file. The course folder is made afresh each time.
grade: $(INSTRUCTOR)
	$(BIN)/python tools/grade.py $(if $(SUBMISSIONS),--submissions $(SUBMISSIONS)) $(if $(LABS),--labs $(LABS))

# Authors: export scripts/ from the notebooks' last %%writefile cells (tests fail when they drift).
scripts: $(STAMP)
	$(BIN)/python tools/export_scripts.py

# Authors: re-execute notebooks and store their outputs, e.g. make outputs NB=notebooks/00_setup_check.ipynb
outputs: $(STAMP)
	$(BIN)/python tools/execute_notebooks.py $(NB)

clean:
	rm -rf build notebooks/work solutions/work labs/work
