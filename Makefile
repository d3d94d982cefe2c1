# Developer entry points. Every target keeps DDS discovery on this machine.
SHELL := /bin/bash
VENV := .venv
PYTHON := $(VENV)/bin/python
DEMO_SECONDS ?= 20

export ROS_AUTOMATIC_DISCOVERY_RANGE := LOCALHOST
export ROS_LOCALHOST_ONLY := 1
export ROS_DOMAIN_ID ?= 31

.PHONY: setup install demo test lint

# The virtual environment with the pinned runtime and test dependencies (ROS 2 Kilted wheels,
# torch, pytest); redone only when a requirements file changes.
setup: $(VENV)/.setup-stamp
$(VENV)/.setup-stamp: requirements.txt requirements-test.txt
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -r requirements-test.txt
	touch $@

# Editable install: puts the vla_policy_node and vla_policy_sim_robot console scripts in
# $(VENV)/bin, running this source tree.
install: $(VENV)/.install-stamp
$(VENV)/.install-stamp: $(VENV)/.setup-stamp setup.py setup.cfg package.xml
	$(VENV)/bin/pip install --no-deps --no-build-isolation -e .
	touch $@

# The node (tiny model, random weights) against the simulated robot for DEMO_SECONDS; the
# robot prints the summary. The node is stopped with SIGTERM, which makes it publish a hold.
demo: install
	@echo "vla_policy_node demo: tiny model with RANDOM weights, $(DEMO_SECONDS) s, ROS_DOMAIN_ID=$(ROS_DOMAIN_ID)"
	@$(VENV)/bin/vla_policy_node --ros-args --params-file config/default.yaml & node=$$!; \
	trap 'kill -TERM $$node 2>/dev/null || true' EXIT; \
	$(VENV)/bin/vla_policy_sim_robot --ros-args --params-file config/demo.yaml \
	    -p duration:=$(DEMO_SECONDS).0 --log-level WARN; status=$$?; \
	kill -TERM $$node; wait $$node; exit $$status

test: install
	$(PYTHON) -m pytest test -q

lint: install
	$(PYTHON) -m pytest test/test_flake8.py test/test_pep257.py -q

# On a CUDA machine (under 5 minutes): the CUDA tests, SmolVLA f32/bf16 with and without CUDA
# graphs, pi0 bf16 with 1 and 3 cameras, and one table of the GPU goals; stops at once without CUDA.
.PHONY: gpu-check
gpu-check: install
	$(PYTHON) -m vla_policy_node.bench.gpu_check

# Optional: LeRobot 0.4.4 in its own environment (it pins torch<2.11) for vla-policy-bench's
# LeRobot column; several GB (PyPI's x86_64 torch is a CUDA build, run on the CPU here).
.PHONY: lerobot-env
lerobot-env: .venv-lerobot/.stamp
.venv-lerobot/.stamp:
	python3 -m venv .venv-lerobot
	.venv-lerobot/bin/pip install 'lerobot[smolvla]==0.4.4'
	touch $@
