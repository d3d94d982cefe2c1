# SPDX-License-Identifier: Apache-2.0
"""
The RunInstruction action of a node process under bursts, races and hostile success signals.

The installed node (default.yaml, the tiny model with random weights, no robot: a goal runs
holding, waiting for its inputs) and the lifecycle node are driven by clients of the test,
each in its own ``rclpy.Context``: a burst of goals and cancels with a second client's goal in
its middle, a goal raced by a cancel-all or a deactivation, successes raised before the goal
or for an earlier episode, and the two time limit modes. Every goal and cancel must be
answered, every result's status must go with its outcome (nav2 / BehaviorTree.CPP read status
SUCCEEDED as success, ABORTED and CANCELED as failure), and the node prints no traceback.
"""

from __future__ import annotations

import threading
import time

from action_msgs.msg import GoalStatus
from action_msgs.srv import CancelGoal
from builtin_interfaces.msg import Time
from probe_robot import ProbeRobot
import pytest
import rclpy
from rclpy.action import ActionClient
from rclpy.executors import SingleThreadedExecutor
from std_msgs.msg import String
from std_srvs.srv import Trigger
from ros_harness import DEFAULT_CONFIG, next_domain_id, NodeProcess, wait_until
from vla_policy_interfaces.action import RunInstruction
from vla_policy_interfaces.msg import Episode, TaskSuccess
import yaml

from vla_policy_node.ros.qos import COMMAND_QOS, EPISODE_QOS, INSTRUCTION_VOLATILE_QOS, SERVICE_QOS
from vla_policy_node.ros.task_action import GOAL_WINDOW_S, GOALS_AT_ONCE

pytestmark = pytest.mark.dds
Goal, Result = RunInstruction.Goal, RunInstruction.Result
CONFIG = yaml.safe_load(DEFAULT_CONFIG.read_text())['/**']['ros__parameters']
BURST = 300
TRIES = 10
# The goal status that goes with each outcome (CANCELLED: the client asked for it).
STATUS = {Result.SUCCEEDED: GoalStatus.STATUS_SUCCEEDED, Result.COMPLETED: GoalStatus.STATUS_SUCCEEDED,
          Result.CANCELLED: GoalStatus.STATUS_CANCELED, Result.TIMED_OUT: GoalStatus.STATUS_ABORTED,
          Result.PREEMPTED: GoalStatus.STATUS_ABORTED, Result.FAULTED: GoalStatus.STATUS_ABORTED,
          Result.REFUSED: GoalStatus.STATUS_ABORTED}


class Client:
    """An action client (with the node's deep service QoS, as a burst needs), a success publisher, ~/episode."""

    def __init__(self, domain_id: int, node_name: str = '/vla_policy_node', name: str = 'task_client') -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node(name, context=self.context)
        self.action = ActionClient(self.node, RunInstruction, f'{node_name}/run_instruction',
                                   goal_service_qos_profile=SERVICE_QOS, result_service_qos_profile=SERVICE_QOS,
                                   cancel_service_qos_profile=SERVICE_QOS)
        self.cancel = self.node.create_client(CancelGoal, f'{node_name}/run_instruction/_action/cancel_goal',
                                              qos_profile=SERVICE_QOS)
        self.success = self.node.create_publisher(TaskSuccess, CONFIG['task_success_topic'], COMMAND_QOS)
        self.episodes: list[Episode] = []
        self.node.create_subscription(Episode, f'{node_name}/episode', self.episodes.append, EPISODE_QOS)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._spinner = threading.Thread(target=self.executor.spin, daemon=True)
        self._spinner.start()
        assert self.action.wait_for_server(timeout_sec=30.0), 'no run_instruction action server'

    def send(self, instruction: str = 'wave', **fields):
        """Send a goal now; return the future of its answer."""
        return self.action.send_goal_async(Goal(instruction=instruction, **fields))

    def cancel_all(self):
        """Ask to cancel every goal (zero id and stamp); return the future of the answer."""
        return self.cancel.call_async(CancelGoal.Request())

    def answered(self, future, timeout: float = 10.0):
        assert wait_until(future.done, timeout), f'not answered within {timeout} s'
        return future.result()

    def accepted(self, **fields):
        handle = self.answered(self.send(**fields))
        assert handle.accepted
        return handle

    def started(self, handle) -> Episode:
        """Return the STARTED event of the goal of ``handle`` on the node's ~/episode."""
        mine = lambda: [e for e in self.episodes if bytes(e.goal_id.uuid) == bytes(handle.goal_id.uuid)]  # noqa: E731
        assert wait_until(mine, 5.0), 'no episode started for the goal'
        return mine()[0]

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=1.0)
        self._spinner.join(2.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


def ended_right(response) -> Result:
    """Assert a result's status goes with its outcome and it says why; return the result."""
    result = response.result
    assert result.outcome in STATUS and result.reason, result
    expected = STATUS[result.outcome]
    assert response.status == expected, (response.status, result)
    return result


def seconds(stamp: Time) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


def stamp(value: float) -> Time:
    return Time(sec=int(value), nanosec=int(round(value % 1 * 1e9)) % 1_000_000_000)


def no_traceback(node: NodeProcess) -> None:
    assert 'Traceback' not in node.output and 'Error raised in execute callback' not in node.output, \
        node.output[-4000:]


@pytest.fixture(scope='module')
def plain():
    """Start the plain node process; yield it, a client of it and its domain."""
    domain_id = next_domain_id()
    node = NodeProcess([DEFAULT_CONFIG], domain_id)
    client = None
    try:
        assert node.wait_for_output('ready:', 90.0), node.output
        client = Client(domain_id)
        yield node, client, domain_id
    finally:
        if client is not None:
            client.close()
        node.kill()


def test_a_burst_of_goals_and_cancels_is_answered_in_full(plain):
    node, client, domain_id = plain
    other = Client(domain_id, name='second_client')
    try:
        goals = [client.send(f'wave {i}', time_limit=3.0) for i in range(BURST // 2)]
        cancels = [client.cancel_all() for _ in range(BURST // 2)]
        middle = other.send('wave from elsewhere', time_limit=3.0)
        goals += [client.send(f'wave {i}', time_limit=3.0) for i in range(BURST // 2, BURST)]
        cancels += [client.cancel_all() for _ in range(BURST // 2, BURST)]
        assert wait_until(lambda: all(f.done() for f in goals + cancels + [middle]), 15.0), (
            f'{sum(f.done() for f in goals)} of {BURST} goals, {sum(f.done() for f in cancels)} of {BURST} cancels '
            f'answered; the second client: {middle.done()}')
        handles = [f.result() for f in goals + [middle]]
        results = [h.get_result_async() for h in handles if h.accepted]
        assert wait_until(lambda: all(f.done() for f in results), 15.0), 'a result never came'
        outcomes = [ended_right(f.result()).outcome for f in results]
        assert outcomes.count(Result.REFUSED) >= len(results) - GOALS_AT_ONCE, outcomes
        assert middle.result().accepted and middle.result().get_result_async()
        no_traceback(node)
    finally:
        other.close()


def test_a_goal_raced_by_a_cancel_all_ends_cancelled(plain):
    node, client, _ = plain
    time.sleep(GOAL_WINDOW_S)                   # the burst bound's window of the test before has passed
    raced = 0
    for _ in range(TRIES):
        goal, cancel = client.send(), client.cancel_all()
        handle, answer = client.answered(goal), client.answered(cancel)
        assert handle.accepted
        if any(bytes(g.goal_id.uuid) == bytes(handle.goal_id.uuid) for g in answer.goals_canceling):
            raced += 1
        else:
            client.answered(client.cancel_all())    # the cancel came first: none to cancel yet
        result = ended_right(client.answered(handle.get_result_async()))
        assert result.outcome == Result.CANCELLED and result.reason == 'cancelled: holding', result
        time.sleep(GOAL_WINDOW_S / GOALS_AT_ONCE)   # within the burst bound
    assert raced, 'every cancel came before its goal: the race was not run'
    no_traceback(node)


def test_stale_and_foreign_successes_never_end_the_goal_and_its_own_does(plain):
    node, client, _ = plain
    handle = client.accepted()
    result = handle.get_result_async()
    started = client.started(handle)
    episode, accepted = started.episode, seconds(handle.stamp)
    assert started.event == Episode.STARTED and started.instruction == 'wave'
    assert wait_until(lambda: client.success.get_subscription_count() > 0, 5.0)
    hostile = [TaskSuccess(stamp=stamp(accepted - 0.001), episode=episode),     # raised before the goal
               TaskSuccess(stamp=stamp(time.time()), episode=episode - 1),       # an earlier episode
               TaskSuccess(stamp=stamp(time.time()), episode=episode + 1),
               TaskSuccess(episode=episode)]                                     # no stamp
    for msg in hostile * 3:
        client.success.publish(msg)
    assert not wait_until(result.done, 1.0), result.result()
    client.success.publish(TaskSuccess(stamp=stamp(time.time()), episode=episode))
    ended = ended_right(client.answered(result))
    assert ended.outcome == Result.SUCCEEDED and ended.episode == episode, ended
    assert wait_until(lambda: any(e.event == Episode.ENDED and e.episode == episode and e.outcome == Result.SUCCEEDED
                                  for e in client.episodes), 5.0)
    assert 'task success ignored' in node.output
    no_traceback(node)


def test_the_instruction_topic_and_the_reset_service_start_episodes_too(plain):
    node, client, _ = plain
    instruction = client.node.create_publisher(String, CONFIG['instruction_topic'], INSTRUCTION_VOLATILE_QOS)
    reset = client.node.create_client(Trigger, '/vla_policy_node/reset_episode')
    assert wait_until(lambda: instruction.get_subscription_count() > 0, 5.0) and reset.wait_for_service(5.0)
    before = len(client.episodes)
    instruction.publish(String(data='touch the red block'))
    assert wait_until(lambda: len(client.episodes) > before, 5.0)
    reply = client.answered(reset.call_async(Trigger.Request()))
    assert wait_until(lambda: len(client.episodes) > before + 1, 5.0)
    topic, service = client.episodes[before:before + 2]
    task = 'touch the red block'
    assert (topic.event, topic.instruction, topic.reason) == (Episode.STARTED, task, 'instruction topic')
    assert (service.event, service.instruction, service.reason) == (Episode.STARTED, task, 'reset_episode service')
    assert service.episode == topic.episode + 1 and not any(service.goal_id.uuid)
    assert reply.success and f'episode {service.episode} started' in reply.message, reply


@pytest.mark.parametrize('mode, outcome, status', [
    (Goal.DURATION, Result.COMPLETED, GoalStatus.STATUS_SUCCEEDED),
    (Goal.CONFIRM, Result.TIMED_OUT, GoalStatus.STATUS_ABORTED)])
def test_what_the_time_limit_means(plain, mode, outcome, status):
    node, client, _ = plain
    handle = client.accepted(time_limit=1.0, time_limit_mode=mode)
    response = client.answered(handle.get_result_async(), 10.0)
    result = ended_right(response)
    assert (result.outcome, response.status) == (outcome, status) and 1.0 <= result.elapsed < 3.0, result


@pytest.fixture(scope='module')
def lifecycle():
    """Start the lifecycle node process and configure it; yield it, a client and a probe (transitions)."""
    domain_id = next_domain_id()
    node = NodeProcess([DEFAULT_CONFIG], domain_id, extra_args=('-r', '__ns:=/lc'),
                       executable='vla_policy_lifecycle_node')
    client = probe = None
    try:
        assert node.wait_for_output('unconfigured:', 60.0), node.output
        probe = ProbeRobot(domain_id, '/lc', CONFIG)
        assert probe.transition('configure')
        client = Client(domain_id, '/lc/vla_policy_node')
        yield node, client, probe
    finally:
        for part in (client, probe):
            if part is not None:
                part.close()
        node.kill()


def test_a_goal_raced_by_a_deactivation_is_rejected_or_ends_faulted(lifecycle):
    node, client, probe = lifecycle
    accepted = 0
    for _ in range(TRIES):
        assert probe.transition('activate')
        goal, deactivate = client.send(), probe.start_transition('deactivate')
        handle = client.answered(goal)
        assert client.answered(deactivate).success
        if handle.accepted:
            accepted += 1
            result = ended_right(client.answered(handle.get_result_async()))
            assert result.outcome == Result.FAULTED, result
            assert result.reason == 'the lifecycle node left active: holding', result
    assert accepted, 'no goal was accepted before the deactivation: the race was not run'
    numbers = [e.episode for e in client.episodes if e.event == Episode.STARTED]
    assert len(numbers) == accepted and numbers == sorted(set(numbers)), 're-activations repeated an episode'
    no_traceback(node)
