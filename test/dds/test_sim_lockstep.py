# SPDX-License-Identifier: Apache-2.0
"""
The simulated robot in lockstep: it steps only when the node has answered, and says so when it did not.

The planar arm runs in this process; a fake policy node in its own ``rclpy.Context`` answers
(or withholds) each tick on ``~/tick_done`` and publishes the /diagnostics state the robot
reads, so the test decides when the node "answers". The last test runs the installed node
with ``use_sim_time`` against the robot in lockstep.
"""

from __future__ import annotations

import time

from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from ros_harness import DEFAULT_CONFIG, next_domain_id, sim_episodes, use_test_domain
from rosgraph_msgs.msg import Clock
from std_srvs.srv import Trigger

from vla_policy_node.ros.diagnostics import status_prefix
from vla_policy_node.ros.qos import CLOCK_QOS, DIAGNOSTICS_QOS, TICK_DONE_QOS
from vla_policy_node.ros.sim.robot import format_report, SimRobot
from vla_policy_node.sim import PLANAR_CHECKPOINT

pytestmark = pytest.mark.dds

PLANAR_CONFIG = DEFAULT_CONFIG.parent / 'planar.yaml'
DT = 0.05                   # planar.yaml: 20 Hz
PROTECTIVE_STOP = 'joints do not follow the command: elbow 0.71 from its point (a protective stop)'


class FakePolicyNode:
    """``/vla_policy_node`` as the robot sees it: reset service, /diagnostics, ``~/tick_done`` on demand."""

    def __init__(self, domain_id: int) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node('vla_policy_node', context=self.context)
        self.clocks: list[float] = []
        self.resets = 0
        self.state = 'holding: waiting for an instruction'
        self.node.create_subscription(Clock, '/clock', self._on_clock, CLOCK_QOS)
        self.node.create_service(Trigger, '~/reset_episode', self._on_reset)
        self.diagnostics = self.node.create_publisher(DiagnosticArray, '/diagnostics', DIAGNOSTICS_QOS)
        self.answers = self.node.create_publisher(Time, '~/tick_done', TICK_DONE_QOS)
        self.node.create_timer(0.05, self._on_diagnostics_tick)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)

    def _on_clock(self, msg: Clock) -> None:
        self.clocks.append(msg.clock.sec + 1e-9 * msg.clock.nanosec)

    def _on_reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        self.resets += 1
        response.success = True
        return response

    def _on_diagnostics_tick(self) -> None:
        name = f"{status_prefix('/vla_policy_node')}: policy"
        self.diagnostics.publish(DiagnosticArray(status=[DiagnosticStatus(
            name=name, message=self.state, values=[KeyValue(key='state', value=self.state)])]))

    def answer(self, seconds: float) -> None:
        nanoseconds = int(round(seconds * 1e9))
        self.answers.publish(Time(sec=nanoseconds // 10**9, nanosec=nanoseconds % 10**9))

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


@pytest.fixture
def lockstep_robot(monkeypatch):
    """Yield a factory: (the planar robot in lockstep with ``overrides``, the fake node, spin(seconds))."""
    made = []

    def make(**overrides):
        domain_id = use_test_domain(monkeypatch)
        fake = FakePolicyNode(domain_id)
        context = rclpy.Context()
        rclpy.init(context=context, domain_id=domain_id)
        robot = SimRobot(context=context, cli_args=['--ros-args', '--params-file', str(PLANAR_CONFIG)],
                         parameter_overrides=[Parameter(k, value=v) for k, v in
                                              {'lockstep': True, 'episodes': 1, **overrides}.items()])
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(robot)
        made.append((fake, robot, executor, context))

        def spin(seconds: float, until=lambda: False) -> bool:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                executor.spin_once(timeout_sec=0.002)
                fake.executor.spin_once(timeout_sec=0.002)
                if until():
                    return True
            return until()
        return robot, fake, spin

    yield make
    for fake, robot, executor, context in made:
        executor.shutdown(timeout_sec=1.0)
        robot.destroy_node()
        rclpy.try_shutdown(context=context)
        fake.close()


def test_the_robot_steps_one_control_period_per_answer_of_the_node_and_its_clock_only_goes_forward(lockstep_robot):
    robot, fake, spin = lockstep_robot(lockstep_timeout=30.0, max_steps=50)
    # Before the episode the robot steps in real time (the node's timers need /clock); the
    # reset answers the episode's first tick, then every step waits for the node.
    assert spin(10.0, lambda: fake.resets == 1), 'the robot never started its episode'
    assert spin(2.0, lambda: fake.clocks and robot._phase == 'running' and not robot._pace.answered)
    spin(0.5)
    waiting = fake.clocks[-1]
    spin(0.5)                                           # no answer: no step, however long
    assert fake.clocks[-1] == waiting
    fake.answer(waiting - DT)                           # an answer to an earlier tick is no answer
    spin(0.3)
    assert fake.clocks[-1] == waiting
    for k in range(1, 6):                               # each answer: exactly one period more
        fake.answer(fake.clocks[-1])
        assert spin(2.0, lambda: fake.clocks[-1] > waiting + (k - 0.5) * DT)
        spin(0.1)
        assert fake.clocks[-1] == pytest.approx(waiting + k * DT, abs=1e-6)
    assert all(b > a for a, b in zip(fake.clocks, fake.clocks[1:])), 'the /clock went back or stood'
    assert robot.reports == []


def test_a_node_that_never_answers_is_waited_for_up_to_the_bound_then_the_episode_runs_and_reports_it(
        lockstep_robot):
    robot, fake, spin = lockstep_robot(lockstep_timeout=0.5, max_steps=6)
    fake.state = f'holding: {PROTECTIVE_STOP}'
    assert spin(10.0, lambda: fake.resets == 1), 'the robot never started its episode'
    started = time.monotonic()
    assert spin(10.0, lambda: robot.finished), 'a silent node froze the simulation'
    assert time.monotonic() - started >= 0.5 - 0.05            # it waited the bound first
    report, = robot.reports
    assert not report.success and report.unanswered >= 5 and report.steps == 6
    assert report.hold == PROTECTIVE_STOP
    line = format_report(1, 1, report)
    assert f'unanswered ticks {report.unanswered}' in line and f'node held: {PROTECTIVE_STOP}' in line
    assert 'real-time factor' in line


def test_the_installed_node_with_sim_time_answers_every_tick_and_its_first_chunk_costs_no_sim_time(
        monkeypatch, tmp_path):
    sim_time = tmp_path / 'sim_time.yaml'
    sim_time.write_text('/**/vla_policy_node:\n  ros__parameters:\n    use_sim_time: true\n')
    robot, output = sim_episodes(monkeypatch, [DEFAULT_CONFIG, PLANAR_CONFIG, sim_time], PLANAR_CHECKPOINT,
                                 PLANAR_CONFIG, {'episodes': 3, 'seed': 11, 'lockstep': True, 'lockstep_timeout': 10.0})
    assert [r.unanswered for r in robot.reports] == [0, 0, 0], robot.reports
    assert sum(r.success for r in robot.reports) >= 2, robot.reports
    # The first chunk is computed while the simulation waits: its command comes one tick after the reset.
    assert all(r.first_command_ms <= 2 * DT * 1e3 + 1e-3 for r in robot.reports), robot.reports
    # Nor does any later chunk: the node starves (holds for want of actions) only as an episode starts.
    assert output.count(']: holding: waiting for actions from the policy') <= len(robot.reports), output[-3000:]
    assert 'ahead of the node clock' not in output         # /clock goes out before the stamps of its step


def test_sim_eval_runs_through_the_node_in_lockstep_and_in_real_time_when_asked(monkeypatch, capsys):
    from unittest import mock

    from vla_policy_node.ros.sim import evaluation
    use_test_domain(monkeypatch)
    assert evaluation.main(['--robot', 'planar', '--episodes', '2', '--no-direct', '--seed', '11']) == 0
    out = capsys.readouterr().out
    assert 'through the node (DDS)' in out and 'success 2/2' in out, out
    done = [mock.Mock(success=True, steps=5)]
    with mock.patch.object(evaluation, 'run_dds', return_value=done) as run:      # the flag reaches the robot
        evaluation.main(['--robot', 'planar', '--episodes', '1', '--no-direct', '--real-time'])
    assert run.call_args.kwargs['lockstep'] is False


def test_a_tick_that_finds_a_chunk_being_computed_is_answered_once_the_chunk_is_in():
    from vla_policy_node.ros.tick_answers import TickAnswers
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=next_domain_id())
    node = rclpy.create_node('vla_policy_node', context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    try:
        busy = [True]
        answers = TickAnswers(node, lambda: busy[0])
        heard: list[Time] = []
        node.create_subscription(Time, '/vla_policy_node/tick_done', heard.append, TICK_DONE_QOS)

        def spin(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                executor.spin_once(timeout_sec=0.01)
        answers.ticked()                        # inference busy: the tick waits
        spin(0.5)
        assert heard == []
        busy[0] = False
        answers.result_in()                     # the chunk is in (from the inference thread)
        spin(0.5)
        assert len(heard) == 1
        answers.ticked()                        # nothing computed: answered at once
        spin(0.5)
        assert len(heard) == 2
        answers.result_in()                     # a result with no tick waiting answers nothing more
        spin(0.3)
        assert len(heard) == 2
    finally:
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.try_shutdown(context=context)
