# SPDX-License-Identifier: Apache-2.0
"""
Helpers for tests that run the installed node as a process and talk to it over DDS.

Every process and probe gets its own ROS_DOMAIN_ID and keeps discovery on localhost, so
tests never see each other or anything outside the machine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
import itertools
import os
from pathlib import Path
import subprocess
import sys
import threading
import time
from typing import Any

from vla_policy_node import ament_registration

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / 'config' / 'default.yaml'
# The tests drive the tiny model with random weights, which the node refuses unless told.
RANDOM_WEIGHTS_ARGS = ('-p', 'allow_random_weights:=true')
# The probes' joints stand still whatever the node commands: with the tracking check on (its
# default) the node would latch a protective stop within a few ticks. Tests of other things turn it
# off; the tracking tests, the action outputs' model arm and the simulated arms follow and keep it.
STILL_ROBOT_ARGS = ('-p', 'limits.max_tracking_error:=[0.0]')
# Runs that share the machine at the same time (two checkouts, say) set different bases.
DOMAIN_BASE = int(os.environ.get('VLA_TEST_DOMAIN_BASE', '40'))
# Above 101 the DDS ports (7400 + 250 * id + offsets) reach Linux's ephemeral range (32768+),
# where another socket may already hold them: tests on domains 104-105 failed that way.
MAX_DOMAIN_ID = 101
assert 0 <= DOMAIN_BASE <= MAX_DOMAIN_ID, f'VLA_TEST_DOMAIN_BASE must be in [0, {MAX_DOMAIN_ID}]'
_allocations = itertools.count()


def wait_until(predicate, timeout: float, period: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds have passed."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(period)
    return predicate()


def next_domain_id() -> int:
    """
    Return the next ROS_DOMAIN_ID of VLA_TEST_DOMAIN_BASE..101, round robin.

    A test stops its processes when it ends, so an id comes back to a later test only after
    every other id of the range was used once (the suite uses about 60).
    """
    assert 'PYTEST_XDIST_WORKER' not in os.environ, (
        'a DDS test ran in the parallel pass of make test, where the domain ids would collide: mark it '
        '@pytest.mark.dds (or the module: pytestmark = pytest.mark.dds)')
    return DOMAIN_BASE + next(_allocations) % (MAX_DOMAIN_ID - DOMAIN_BASE + 1)


def ros_env(domain_id: int) -> dict[str, str]:
    """Build the environment of a node process: loopback-only discovery on its own domain."""
    env = dict(os.environ)
    env.update(ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST', ROS_LOCALHOST_ONLY='1',
               ROS_DOMAIN_ID=str(domain_id), PYTHONUNBUFFERED='1',
               RCUTILS_COLORIZED_OUTPUT='0')
    return env


def use_test_domain(monkeypatch) -> int:
    """Point this process's ROS_* environment at the next test domain (loopback only); return its id."""
    domain_id = next_domain_id()
    for key, value in ros_env(domain_id).items():
        if key.startswith('ROS_'):
            monkeypatch.setenv(key, value)
    return domain_id


@contextmanager
def contexts_in_test_domain(monkeypatch, count: int = 2) -> Iterator[list[Any]]:
    """Yield ``count`` rclpy contexts initialised in the next test domain (a node and peers), then shut them down."""
    import rclpy

    domain_id = use_test_domain(monkeypatch)
    contexts = [rclpy.Context() for _ in range(count)]
    for context in contexts:
        rclpy.init(context=context, domain_id=domain_id)
    try:
        yield contexts
    finally:
        for context in contexts:
            rclpy.try_shutdown(context=context)


def installed_executable(name: str = 'vla_policy_node') -> Path:
    """Return the installed executable ``name`` (the package's own lookup, asserted to exist)."""
    try:
        return ament_registration.installed_executable(name)
    except FileNotFoundError as missing:
        raise AssertionError(str(missing)) from None


class OutputProcess:
    """A subprocess whose merged stdout/stderr a thread collects line by line."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, cwd=ROOT)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip('\n'))

    @property
    def output(self) -> str:
        """Everything the process printed so far."""
        return '\n'.join(self.lines)

    def wait_for_output(self, text: str, timeout: float) -> bool:
        """Wait until ``text`` appears in the output (False on timeout or process exit)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if text in self.output:
                return True
            if self.process.poll() is not None:
                self._reader.join(1.0)
                return text in self.output
            time.sleep(0.05)
        return False

    def wait(self, timeout: float) -> int:
        """Wait for exit and for the output to be read; returns the exit code."""
        code = self.process.wait(timeout)
        self._reader.join(2.0)
        return code

    def kill(self) -> None:
        """Make sure the process is gone (test teardown)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5.0)


class NodeProcess(OutputProcess):
    """The installed node (or ``command``) as a subprocess on its own domain."""

    def __init__(self, params_files: list[Path], domain_id: int,
                 extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 random_weights: bool = True, executable: str = 'vla_policy_node',
                 command: tuple[str, ...] | None = None, still_robot: bool = False) -> None:
        """``still_robot``: the robot the test plays does not follow the commands (``STILL_ROBOT_ARGS``)."""
        args = list(command or (str(installed_executable(executable)),)) + ['--ros-args']
        for params in params_files:
            args += ['--params-file', str(params)]
        args += list(RANDOM_WEIGHTS_ARGS if random_weights else ()) + list(STILL_ROBOT_ARGS if still_robot else ())
        args += list(extra_args)
        super().__init__(args, {**ros_env(domain_id), **(env or {})})


# The policy server, started from the code under test (the console script may predate it).
SERVER_COMMAND = (sys.executable, '-c',
                  'from vla_policy_node.ros.entry import server_main; raise SystemExit(server_main())')


@contextmanager
def node_with_probe(params_files: list[Path], domain_id: int, make_probe: Callable[[int], Any],
                    ready_timeout: float = 60.0,
                    env: dict[str, str] | None = None) -> Iterator[tuple[NodeProcess, Any]]:
    """Start the installed node, wait until it is ready, yield it with a probe; stop both after."""
    node = NodeProcess(params_files, domain_id, env=env, still_robot=True)
    probe = None
    try:
        assert node.wait_for_output('ready:', timeout=ready_timeout), node.output
        probe = make_probe(domain_id)
        yield node, probe
    finally:
        if probe is not None:
            probe.close()
        node.kill()


def sim_episodes(monkeypatch: Any, params_files: list[Path], checkpoint: Path, robot_file: Path,
                 overrides: dict[str, Any], timeout: float = 150.0) -> tuple[Any, str]:
    """
    Run the simulated robot (``robot_file`` with ``overrides``) in process against the installed node.

    The node reads ``params_files`` and ``checkpoint``; returns the robot once its episodes are
    over (destroyed, its reports and followers still readable) and the node's output.
    """
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.parameter import Parameter

    from vla_policy_node.ros.sim.robot import SimRobot

    domain_id = use_test_domain(monkeypatch)
    node = NodeProcess(params_files, domain_id, extra_args=('-p', f'checkpoint:={checkpoint}'))
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain_id)
    robot = SimRobot(context=context, cli_args=['--ros-args', '--params-file', str(robot_file)],
                     parameter_overrides=[Parameter(name, value=value) for name, value in overrides.items()])
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(robot)
    try:
        assert node.wait_for_output('ready:', timeout=90.0), node.output
        deadline = time.monotonic() + timeout
        while not robot.finished and time.monotonic() < deadline and node.process.poll() is None:
            executor.spin_once(timeout_sec=0.01)
        assert robot.finished, (robot.reports, node.output[-3000:])
        return robot, node.output
    finally:
        executor.shutdown(timeout_sec=1.0)
        robot.destroy_node()
        rclpy.try_shutdown(context=context)
        node.kill()
