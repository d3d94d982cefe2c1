# Developer entry points. Every target keeps DDS discovery on this machine.
SHELL := /bin/bash
VENV := .venv
PYTHON := $(VENV)/bin/python
DEMO_EPISODES ?= 10
# true: the simulated robot keeps time in lockstep with the node (/clock, use_sim_time); false: real time.
DEMO_LOCKSTEP ?= true

export ROS_AUTOMATIC_DISCOVERY_RANGE := LOCALHOST
export ROS_LOCALHOST_ONLY := 1
export ROS_DOMAIN_ID ?= 31
# The venv is an ament prefix: ros2 launch / ros2 run find the packages registered in it.
export AMENT_PREFIX_PATH := $(abspath $(VENV))$(if $(AMENT_PREFIX_PATH),:$(AMENT_PREFIX_PATH))

.PHONY: setup install demo train test lint

# The ROS 2 launch and command-line tools (launch, launch_ros, launch_testing, ros2cli), built
# unchanged from their public sources: not on PyPI, so installed only where the folder is.
ROS2_LAUNCH ?= ../shared/ros2-launch
LAUNCH_STAMP := $(if $(wildcard $(ROS2_LAUNCH)/wheels/*.whl),$(VENV)/.launch-stamp)
export VLA_ROS2_LAUNCH_DIR := $(abspath $(ROS2_LAUNCH))
INTERFACES_STAMP := $(VENV)/.interfaces-stamp

# The virtual environment with the pinned runtime and test dependencies (ROS 2 Kilted wheels,
# torch, pytest); redone only when a requirements file changes.
setup: $(VENV)/.setup-stamp $(INTERFACES_STAMP) $(LAUNCH_STAMP) $(CONTROL_MSGS_STAMP)
$(VENV)/.setup-stamp: requirements.txt requirements-test.txt
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -r requirements-test.txt
	$(MAKE) --no-print-directory gl
	touch $@

# MuJoCo renders the simulated SO-101's camera headless through EGL (Mesa's software renderer
# where there is no GPU): the GL libraries are installed with apt-get where missing and allowed.
GL_CHECK := MUJOCO_GL=egl $(PYTHON) -c 'import mujoco; mujoco.Renderer(mujoco.MjModel.from_xml_string("<mujoco/>"), 8, 8).render()'
.PHONY: gl
gl:
	@$(GL_CHECK) 2>/dev/null || { \
	    test "$$(id -u)" = 0 || { echo "MuJoCo cannot render headless: install EGL (Debian: libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri)"; exit 1; }; \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
	        libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri && $(GL_CHECK); }

# Interface packages without a wheel are generated with the ROS 2 interface generators from PyPI
# (requirements-interfaces.txt; CMake, a C++ compiler, Python headers: installed with apt-get
# where missing and allowed) and installed into the venv, whose lib/ the ROS wheels put on the
# library path. The generators' exported CMake targets name the include folders of the machine
# that built the wheels: they are pointed at this venv's. INTERFACE_BUILD builds one package:
# $(call INTERFACE_BUILD,name,source folder).
define INTERFACE_BUILD
	rm -rf build/$(1)
	PATH=$(abspath $(VENV))/bin:$$PATH cmake -S $(2) -B build/$(1) -DCMAKE_INSTALL_PREFIX=$(abspath $(VENV)) \
	    -DCMAKE_PREFIX_PATH=$(abspath $(VENV)) -DPython3_EXECUTABLE=$(abspath $(PYTHON)) -DBUILD_TESTING=OFF
	cmake --build build/$(1) -j 2
	cmake --install build/$(1)
endef

$(VENV)/.generators-stamp: $(VENV)/.setup-stamp requirements-interfaces.txt
	$(VENV)/bin/pip install -r requirements-interfaces.txt
	@include=$$($(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])'); \
	if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null || ! test -f $$include/Python.h; then \
	    test "$$(id -u)" = 0 || { echo "the interface packages need cmake, g++ and $$include/Python.h: install them (Debian: cmake g++ python3-dev)"; exit 1; }; \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends cmake g++ make python3-dev; \
	fi; \
	test -f $$include/Python.h || include=$$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])'); \
	numpy=$$($(PYTHON) -c 'import numpy; print(numpy.get_include())'); \
	grep -l /opt/python/cp311-cp311 $(VENV)/share/*/cmake/*.cmake | xargs -r sed -i \
	    -e "s#/opt/python/cp311-cp311/lib/python3.11/site-packages/numpy/_core/include#$$numpy#g" \
	    -e "s#/opt/python/cp311-cp311/include/python3.11#$$include#g"
	touch $@

# vla_policy_interfaces (interfaces/: the RunInstruction action the node serves, the messages of
# vla_policy_server's topic pair), always; regenerated when a definition changes.
$(INTERFACES_STAMP): $(VENV)/.generators-stamp $(wildcard interfaces/vla_policy_interfaces/* interfaces/vla_policy_interfaces/*/*)
	$(call INTERFACE_BUILD,vla_policy_interfaces,interfaces/vla_policy_interfaces)
	$(PYTHON) -c 'import vla_policy_interfaces.action, vla_policy_interfaces.msg'
	touch $@

# launch_ros imports composition_interfaces, a message package without a wheel: generated as above.
# The verbs `ros2 interface` and `ros2 action` have no wheel there: their unchanged sources are in
# tools/ros2cli (ros2/ros2cli at the wheels' commit, see its README), installed beside the wheels.
ROS2CLI_VERBS := tools/ros2cli/ros2interface tools/ros2cli/ros2action
$(VENV)/.launch-stamp: $(VENV)/.generators-stamp requirements-launch.txt \
    $(foreach verb,$(ROS2CLI_VERBS),$(verb)/setup.py $(wildcard $(verb)/*/*.py $(verb)/*/*/*.py))
	$(VENV)/bin/pip install -r requirements-launch.txt
	$(VENV)/bin/pip install --no-deps $(ROS2_LAUNCH)/wheels/*.whl
	$(VENV)/bin/pip install --no-deps --no-build-isolation $(ROS2CLI_VERBS)
	rm -rf $(foreach verb,$(ROS2CLI_VERBS),$(verb)/build $(verb)/*.egg-info)
	$(call INTERFACE_BUILD,composition_interfaces,$(ROS2_LAUNCH)/src/composition_interfaces)
	$(PYTHON) -c 'import composition_interfaces.srv, launch_ros.actions, launch_testing'
	$(PYTHON) -c 'import ros2interface.verb.show, ros2action.verb.send_goal, rosidl_adapter.parser'
	touch $@

# control_msgs (FollowJointTrajectory, GripperCommand: the command_interface follow_joint_trajectory
# and gripper_command) has no wheel either: its definitions in ../shared/ros2-interfaces are
# generated the same way, trimmed to what the node uses (interfaces/control_msgs: CMakeLists.txt,
# package.xml; COLCON_IGNORE keeps a robot's workspace on its distribution's control_msgs).
ROS2_INTERFACES ?= ../shared/ros2-interfaces
CONTROL_MSGS_STAMP := $(if $(wildcard $(ROS2_INTERFACES)/control_msgs/package.xml),$(VENV)/.control-msgs-stamp)
CONTROL_MSGS_FILES := action/FollowJointTrajectory.action action/GripperCommand.action msg/GripperCommand.msg \
    msg/JointComponentTolerance.msg msg/JointTolerance.msg
$(VENV)/.control-msgs-stamp: $(VENV)/.generators-stamp interfaces/control_msgs/CMakeLists.txt \
    interfaces/control_msgs/package.xml
	rm -rf build/control_msgs_src
	mkdir -p build/control_msgs_src/msg build/control_msgs_src/action
	cp interfaces/control_msgs/CMakeLists.txt interfaces/control_msgs/package.xml \
	    $(ROS2_INTERFACES)/control_msgs/LICENSE build/control_msgs_src/
	for f in $(CONTROL_MSGS_FILES); do cp $(ROS2_INTERFACES)/control_msgs/$$f build/control_msgs_src/$$f; done
	$(call INTERFACE_BUILD,control_msgs,build/control_msgs_src)
	$(PYTHON) -c 'from control_msgs.action import FollowJointTrajectory, GripperCommand'
	touch $@

# Editable install: puts the vla_policy_node, vla_policy_lifecycle_node, vla_policy_server,
# vla_policy_sim_robot, vla-policy-bench, vla-policy-train, vla-policy-sim-eval and
# vla-policy-replay console scripts in $(VENV)/bin, running this source tree.
install: $(VENV)/.install-stamp
$(VENV)/.install-stamp: $(VENV)/.setup-stamp $(INTERFACES_STAMP) $(LAUNCH_STAMP) $(CONTROL_MSGS_STAMP) setup.py \
    setup.cfg package.xml \
    $(wildcard launch/* config/*)
	$(VENV)/bin/pip install --no-deps --no-build-isolation -e .
	$(PYTHON) -m vla_policy_node.ament_registration $(VENV)
	touch $@

# The node drives the simulated SO-101 (MuJoCo) with the policy that ships in the package
# (vla_policy_node/sim/so101/touch_policy, trained by `make train`) for DEMO_EPISODES episodes,
# reading default.yaml, so101.yaml (the arm's units, controllers, limits) and demo.yaml; the
# robot prints each episode and the success rate and saves the first one, captioned, as
# demo_episode.gif / demo_episode.png. The node is stopped with SIGTERM (it publishes a hold).
# Lockstep unless `make demo DEMO_LOCKSTEP=false` (real time: physics on the wall clock).
demo: install
	@ckpt=$$($(PYTHON) -m vla_policy_node.sim checkpoint so101) || exit 1; \
	echo "vla_policy_node demo: the shipped SO-101 policy, $(DEMO_EPISODES) episodes, lockstep $(DEMO_LOCKSTEP), ROS_DOMAIN_ID=$(ROS_DOMAIN_ID)"; \
	$(VENV)/bin/vla_policy_node --ros-args --params-file config/default.yaml --params-file config/so101.yaml \
	    --params-file config/demo.yaml -p checkpoint:=$$ckpt -p use_sim_time:=$(DEMO_LOCKSTEP) --log-level ERROR & node=$$!; \
	trap 'kill -TERM $$node 2>/dev/null || true' EXIT; \
	$(VENV)/bin/vla_policy_sim_robot --ros-args --params-file config/demo.yaml -p lockstep:=$(DEMO_LOCKSTEP) \
	    -p episodes:=$(DEMO_EPISODES) -p record_prefix:=demo_episode --log-level WARN; status=$$?; \
	kill -TERM $$node; wait $$node; exit $$status

# Retrain the shipped SO-101 policy from scripted demonstrations in LeRobot's SO-101 units, seeded:
# vla-policy-train's defaults, 1,200 expert episodes, 6,000 steps of batch 64 over two
# data-parallel workers of one core each (BENCHMARKS.md "Task success" has the time). The planar
# test arm's policy: vla-policy-train --robot planar --episodes 3000 --output vla_policy_node/sim/planar/touch_policy
train: install
	$(VENV)/bin/vla-policy-train --output vla_policy_node/sim/so101/touch_policy

# Every test, in two passes: those not marked dds (the pure core, the compiled programs, the
# linters) on TEST_WORKERS pytest-xdist workers, then the DDS tests one at a time, each on a
# ROS domain of its own and some asserting rates. Both passes run; either failing fails.
TEST_WORKERS ?= 2
test: install
	@status=0; \
	$(PYTHON) -m pytest test -q -m "not dds" -n $(TEST_WORKERS) --dist worksteal || status=1; \
	$(PYTHON) -m pytest test -q -m dds || status=1; \
	exit $$status

lint: install
	$(PYTHON) -m pytest test/tools/test_flake8.py test/tools/test_pep257.py -q

# On a CUDA machine (under 5 minutes): the CUDA tests, SmolVLA f32/bf16 with and without CUDA
# graphs, pi0 bf16 with 1 and 3 cameras, and one table of the GPU goals; stops at once without CUDA.
# No install step: it needs no ROS, only a Python whose torch is a CUDA build (the venv's, when
# there is one, else the machine's python3; GPU_PYTHON=... to choose), so it runs offline on a
# GPU machine that has torch. GPU_CHECK_ARGS: e.g. --out DIR --budget 480.
GPU_PYTHON ?= $(shell test -x '$(PYTHON)' && echo '$(PYTHON)' || echo python3)
.PHONY: gpu-check
gpu-check:
	$(GPU_PYTHON) -m benchmarks.gpu_check $(GPU_CHECK_ARGS)

# Optional, for developers: regenerate the LeRobot 0.6.1 and 0.5.1 reference checkpoints under
# test/fixtures/ (make test never needs LeRobot). Each LeRobot goes in a venv of its own, patched to
# run on Python 3.11 (tools/lerobot/setup_env.sh); the fixtures come out bit-identical.
.PHONY: lerobot-fixtures
lerobot-fixtures:
	tools/lerobot/setup_env.sh 0.6.1 .venv-lerobot061
	.venv-lerobot061/bin/python tools/lerobot/make_fixtures.py
	.venv-lerobot061/bin/python tools/lerobot/make_rtc_fixture.py test/fixtures/lerobot061/smolvla
	.venv-lerobot061/bin/python tools/lerobot/make_dataset_fixtures.py test/fixtures/lerobot061/datasets
	tools/lerobot/setup_env.sh 0.5.1 .venv-lerobot051
	.venv-lerobot051/bin/python tools/lerobot/make_fixtures.py

# Optional, for developers: LeRobot 0.6.1 opens a dataset exported from a (synthetic) bag with the
# same values as the project's reader, and lerobot-train runs 3 steps of the shipped SO-101 policy,
# exported for LeRobot 0.6, on it (tools/lerobot/check_export.py).
EXPORT_CHECK := build/lerobot-export-check
EXPORT_PARAMS := --params-file config/so101.yaml -p 'camera_names:=[front]' \
    -p 'camera_topics:=[camera/front/image_raw]' -p 'camera_transports:=[raw]' -p control_rate_hz:=10.0
.PHONY: lerobot-export-check
lerobot-export-check:
	rm -rf $(EXPORT_CHECK) && mkdir -p $(EXPORT_CHECK)
	$(PYTHON) -m benchmarks.synthetic_bag $(EXPORT_CHECK)/run.mcap $(EXPORT_PARAMS) -p allow_random_weights:=true \
	    --seconds 4 --width 64 --height 64 --camera-hz 10 --later-task 'put it in the box'
	$(VENV)/bin/vla-policy-replay $(EXPORT_CHECK)/run.mcap $(EXPORT_PARAMS) --robot-type so101_follower \
	    --export-dataset $(EXPORT_CHECK)/so101_runs
	$(VENV)/bin/vla-policy-train --export-from vla_policy_node/sim/so101/touch_policy \
	    --output $(EXPORT_CHECK)/policy --lerobot-version 0.6
	.venv-lerobot061/bin/python tools/lerobot/check_export.py $(EXPORT_CHECK)/so101_runs \
	    --policy $(EXPORT_CHECK)/policy --output $(EXPORT_CHECK)/train

# Optional: LeRobot 0.4.4 in its own environment (it pins torch<2.11) for vla-policy-bench's
# LeRobot column; several GB (PyPI's x86_64 torch is a CUDA build, run on the CPU here).
.PHONY: lerobot-env
lerobot-env: .venv-lerobot/.stamp
.venv-lerobot/.stamp:
	python3 -m venv .venv-lerobot
	.venv-lerobot/bin/pip install 'lerobot[smolvla]==0.4.4'
	touch $@
