# SPDX-License-Identifier: Apache-2.0
"""
The managed lifecycle node over DDS: transitions load, command, hold and free as documented.

One process (``vla_policy_lifecycle_node`` in namespace ``/lc``) is driven through
configure, activate, deactivate, activate, cleanup, configure, activate and shutdown, in file
order, by a probe robot; ``ros2 lifecycle set`` does one transition where ros2cli is
installed. Outside ``active`` nothing may be commanded, and a latched instruction must not
start motion by itself after a re-activation or a re-configuration. Signals during a slow
configure, or after a cleanup that left a step running, run the real ``main`` with a scripted
slow policy (scripted_lifecycle_node.py); the other in-process tests drive the transitions
directly.
"""

from __future__ import annotations

import gc
from pathlib import Path
import signal
import subprocess
import sys
import time
import weakref

from probe_robot import ProbeRobot, wait_until
import pytest
from rclpy.qos import DurabilityPolicy
from ros_harness import DEFAULT_CONFIG, next_domain_id, NodeProcess, RANDOM_WEIGHTS_ARGS, ROOT, ros_env
from scripted_policy import ScriptedPolicy
import yaml

from vla_policy_node.control.chunking import ChunkRequest

pytestmark = pytest.mark.dds

CONFIG = yaml.safe_load(DEFAULT_CONFIG.read_text())['/**']['ros__parameters']
NAMESPACE = '/lc'
QUIET_S = 1.5           # long enough for a chunk (tiny model) and a few 20 Hz ticks
ROS2 = Path(sys.executable).parent / 'ros2'


class Lifecycle:
    """The node process and the probe robot on one domain."""

    def __init__(self) -> None:
        self.domain_id = next_domain_id()
        self.node = NodeProcess([DEFAULT_CONFIG], self.domain_id,
                                extra_args=('-r', f'__ns:={NAMESPACE}'),
                                executable='vla_policy_lifecycle_node')
        assert self.node.wait_for_output('unconfigured:', timeout=60.0), self.node.output
        self.robot = ProbeRobot(self.domain_id, NAMESPACE, CONFIG)

    def quiet(self, seconds: float = QUIET_S) -> bool:
        """Whether no command arrives for ``seconds``."""
        since = time.monotonic()
        time.sleep(seconds)
        return self.robot.command_count(since) == 0

    def commands_flow(self, timeout: float = 30.0) -> bool:
        """Whether a few commands arrive within ``timeout``."""
        since = time.monotonic()
        return wait_until(lambda: self.robot.command_count(since) >= 3, timeout)


@pytest.fixture(scope='module')
def system():
    """Start the lifecycle node (unconfigured) and the probe."""
    system = Lifecycle()
    try:
        yield system
    finally:
        system.robot.close()
        system.node.kill()


def test_unconfigured_loads_nothing_and_commands_nothing(system):
    assert system.robot.lifecycle_state() == 'unconfigured'
    assert system.quiet()
    assert 'policy ready:' not in system.node.output


def test_configure_loads_and_warms_up_but_commands_nothing(system):
    assert system.robot.transition('configure')
    assert system.robot.lifecycle_state() == 'inactive'
    assert system.node.output.count('policy ready:') == 1
    assert system.robot.node.count_subscribers('instruction') == 0, 'subscribed to the task while inactive'
    system.robot.instruct('pick up the cube', latched=True, wait_for_subscriber=False)    # kept by the publisher
    assert system.quiet(), system.node.output
    reply = system.robot.reset_episode()
    assert not reply.success and reply.message == 'not active: there is no episode to reset'
    reply = system.robot.restart_from_measured()
    assert not reply.success and reply.message == 'not active: activating starts from the measured joint state'


def test_a_goal_is_refused_until_active_and_leaving_active_ends_it_faulted(system):
    """The RunInstruction action of the lifecycle node: a task only while active."""
    from rclpy.action import ActionClient
    from vla_policy_interfaces.action import RunInstruction
    client = ActionClient(system.robot.node, RunInstruction, f'{NAMESPACE}/vla_policy_node/run_instruction')
    assert client.wait_for_server(timeout_sec=30.0)

    def send():
        future = client.send_goal_async(RunInstruction.Goal(instruction='pick up the cube'))
        assert wait_until(future.done, 10.0)
        return future.result()
    assert not send().accepted, 'a goal was taken while inactive'
    assert system.robot.transition('activate')
    handle = send()
    assert handle.accepted and system.commands_flow(), system.node.output
    result = handle.get_result_async()
    assert system.robot.transition('deactivate')
    assert wait_until(result.done, 10.0)
    assert result.result().result.outcome == RunInstruction.Result.FAULTED
    assert result.result().result.reason == 'the lifecycle node left active: holding'
    assert system.quiet()
    client.destroy()


def test_activate_waits_for_an_instruction_published_after_it(system):
    assert system.robot.transition('activate')
    assert system.robot.lifecycle_state() == 'active'
    assert 'episode reset #1 (activate)' in system.node.output, 'an activation starts a new episode'
    assert system.quiet(), 'the latched instruction from before the activation started motion'
    system.robot.instruct('pick up the cube')                   # volatile, like ros2 topic pub
    assert system.commands_flow(), system.node.output


def test_deactivate_holds_and_keeps_the_model_warm(system):
    if ROS2.exists():       # the user's way: ros2 lifecycle set
        for _ in range(3):  # its discovery may miss the node on a loaded machine
            result = subprocess.run(
                [str(ROS2), 'lifecycle', 'set', '--no-daemon', '--spin-time', '5',
                 f'{NAMESPACE}/vla_policy_node', 'deactivate'], env=ros_env(system.domain_id),
                capture_output=True, text=True, timeout=60)
            if 'Node not found' not in result.stderr:
                break
        assert result.returncode == 0 and 'Transitioning successful' in result.stdout, \
            result.stdout + result.stderr
    else:
        assert system.robot.transition('deactivate')
    assert system.node.wait_for_output('inactive: holding', timeout=5.0)
    last = system.robot.commands[-1][1]
    assert len(last.points) == 1, 'the last message on deactivate is one hold point'
    assert system.quiet()
    assert system.robot.transition('activate')
    assert system.quiet(), 'a re-activation started motion without a new instruction'
    system.robot.instruct('pick up the cube')
    assert system.commands_flow(), system.node.output
    assert system.node.output.count('policy ready:') == 1, 'the model was loaded again'


def test_cleanup_frees_and_a_new_configure_ignores_the_latched_instruction(system):
    assert system.robot.transition('deactivate')
    assert system.robot.transition('cleanup')
    assert system.robot.lifecycle_state() == 'unconfigured'
    assert system.node.wait_for_output('policy freed', timeout=5.0)
    assert system.robot.transition('configure')
    assert system.node.output.count('policy ready:') == 2
    assert system.robot.transition('activate')
    # The new subscriptions received the latched task again: it must not start motion.
    assert system.quiet(), 'a latched instruction started motion after a restart'
    system.robot.instruct('put it in the box')
    assert system.commands_flow(), system.node.output


def test_only_an_instruction_published_while_active_starts_motion_latched_or_not(system):
    """The instruction subscription lives while active and is volatile: no sample from before it reaches it."""
    assert system.robot.transition('deactivate')
    assert wait_until(lambda: system.robot.node.count_subscribers('instruction') == 0, 5.0)
    system.robot.instruct('pick up the cube', latched=True, wait_for_subscriber=False)
    assert system.robot.transition('activate')
    assert wait_until(lambda: system.robot.node.count_subscribers('instruction') == 1, 5.0)
    info, = system.robot.node.get_subscriptions_info_by_topic('instruction')
    assert info.qos_profile.durability == DurabilityPolicy.VOLATILE
    assert 'an instruction latched before the activation is not taken: publish it again' in system.node.output
    assert system.quiet(), 'an instruction latched before the activation started motion'
    system.robot.instruct('stack the cubes', latched=True)
    assert system.commands_flow(), system.node.output


def test_shutdown_holds_and_sigint_exits_zero(system):
    count = len(system.robot.commands)
    assert system.robot.transition('shutdown')
    assert system.robot.lifecycle_state() == 'finalized'
    assert wait_until(lambda: len(system.robot.commands) > count, 5.0)
    time.sleep(0.3)
    assert len(system.robot.commands[-1][1].points) == 1, 'shutdown ends with one hold point'
    assert system.quiet()
    system.node.process.send_signal(signal.SIGINT)
    assert system.node.wait(20.0) == 0, system.node.output


def test_an_unconfigured_lifecycle_node_ticks_nothing_and_stops_cleanly():
    """In-process, no policy loaded: gated callbacks do nothing, SIGINT handling has nothing to hold."""
    import rclpy

    from ros_harness import RANDOM_WEIGHTS_ARGS
    from vla_policy_node.ros.lifecycle_node import VlaPolicyLifecycleNode
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=next_domain_id())
    node = VlaPolicyLifecycleNode(context=context, cli_args=[
        '--ros-args', '--params-file', str(DEFAULT_CONFIG), *RANDOM_WEIGHTS_ARGS])
    try:
        node._on_control_tick()
        node._on_chunk_ready()
        assert node._loop is None and node._worker is None
        assert node.inference_alive and node.stop()
    finally:
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def test_configure_is_not_mistaken_for_a_dead_inference_thread(monkeypatch):
    """
    ``main`` polls ``inference_alive`` while configure runs; a worker loaded but not yet started must count as alive.

    Creating the topics after loading took long enough on a loaded CI machine for ``main`` to see
    the fresh, unstarted thread as dead and exit the node right after configure succeeded.
    """
    import rclpy
    from rclpy.lifecycle import TransitionCallbackReturn

    from ros_harness import RANDOM_WEIGHTS_ARGS
    from vla_policy_node.ros.lifecycle_node import VlaPolicyLifecycleNode
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=next_domain_id())
    node = VlaPolicyLifecycleNode(context=context, cli_args=[
        '--ros-args', '--params-file', str(DEFAULT_CONFIG), *RANDOM_WEIGHTS_ARGS])
    seen = []
    wire = node._wire

    def observed_wire():
        seen.append((node._worker is not None and not node._worker.alive, node.inference_alive))
        wire()

    monkeypatch.setattr(node, '_wire', observed_wire)
    try:
        assert node.on_configure(None) == TransitionCallbackReturn.SUCCESS
        assert seen == [(True, True)]          # loaded, not started, and still "alive" to main
        assert node.inference_alive and node._worker.alive
        node.on_cleanup(None)
        assert node.inference_alive and node._worker is None
    finally:
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def test_limits_cannot_be_loosened_while_unconfigured_and_a_configure_keeps_the_start_envelope():
    """Between cleanup and configure there is no loop to object; the start envelope still does."""
    import rclpy
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter

    from ros_harness import RANDOM_WEIGHTS_ARGS
    from vla_policy_node.ros.lifecycle_node import VlaPolicyLifecycleNode
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=next_domain_id())
    node = VlaPolicyLifecycleNode(context=context, cli_args=[
        '--ros-args', '--params-file', str(DEFAULT_CONFIG), *RANDOM_WEIGHTS_ARGS])
    start_step = CONFIG['limits']['max_step']
    try:
        result = node.set_parameters_atomically([Parameter('limits.max_step', value=start_step * 10)])
        assert not result.successful and 'may only be tightened' in result.reason
        assert node.set_parameters_atomically([Parameter('limits.max_step', value=start_step / 2)]).successful
        assert node.on_configure(None) == TransitionCallbackReturn.SUCCESS
        assert node._loop.settings.limits.max_step == start_step / 2
        node.on_cleanup(None)
        result = node.set_parameters_atomically([Parameter('limits.max_step', value=start_step)])
        assert result.successful, 'back up to the start envelope is allowed'
        result = node.set_parameters_atomically([Parameter('limits.max_step', value=start_step * 2)])
        assert not result.successful and 'may only be tightened' in result.reason
    finally:
        node.destroy_node()
        rclpy.try_shutdown(context=context)


class ScriptedLifecycle:
    """The lifecycle node with a scripted slow policy (scripted_lifecycle_node.py) and the probe."""

    def __init__(self, **slow: str) -> None:
        domain_id = next_domain_id()
        self.node = NodeProcess([DEFAULT_CONFIG], domain_id, extra_args=('-r', f'__ns:={NAMESPACE}'), env=slow,
                                command=(sys.executable, str(ROOT / 'test' / 'scripted_lifecycle_node.py')))
        assert self.node.wait_for_output('unconfigured:', timeout=60.0), self.node.output
        self.robot = ProbeRobot(domain_id, NAMESPACE, CONFIG)

    def interrupt(self) -> float:
        """Send SIGINT; return how long the process took to exit, asserted clean."""
        start = time.monotonic()
        self.node.process.send_signal(signal.SIGINT)
        assert self.node.wait(10.0) == 0, self.node.output
        assert 'terminate called' not in self.node.output and 'Traceback' not in self.node.output, self.node.output
        return time.monotonic() - start

    def close(self) -> None:
        """Stop the probe and make sure the process is gone."""
        self.robot.close()
        self.node.kill()


def test_sigint_while_configure_loads_exits_promptly_without_an_abort():
    """The loading transition cannot be interrupted: the process ends under it, commanding nothing."""
    system = ScriptedLifecycle(SLOW_LOAD_S='60')
    try:
        system.robot.start_transition('configure')
        assert system.node.wait_for_output('SLOW LOAD', timeout=30.0), system.node.output
        time.sleep(0.5)
        assert system.interrupt() < 5.0, system.node.output
        assert 'stopped during configure' in system.node.output
        assert system.robot.commands == []
    finally:
        system.close()


def test_sigint_after_a_cleanup_left_a_step_running_exits_promptly_without_an_abort():
    system = ScriptedLifecycle(SLOW_STEP_S='60')
    try:
        assert system.robot.transition('configure') and system.robot.transition('activate')
        system.robot.instruct('pick up the cube')
        assert system.node.wait_for_output('SLOW STEP', timeout=30.0), system.node.output
        assert system.robot.transition('deactivate') and system.robot.transition('cleanup')
        assert system.node.wait_for_output('a policy step still runs', timeout=5.0), system.node.output
        assert 'policy freed' not in system.node.output, 'cleanup claimed to free a policy still running'
        count = len(system.robot.commands)
        assert system.interrupt() < 5.0, system.node.output
        assert len(system.robot.commands) == count, 'the freed policy\'s step reached the robot'
    finally:
        system.close()


def _lifecycle_node(monkeypatch=None, make_policy=None):
    """Return (the context, an unconfigured lifecycle node), optionally with a stand-in policy loader."""
    import rclpy

    from vla_policy_node.ros import node as node_module
    from vla_policy_node.ros.lifecycle_node import VlaPolicyLifecycleNode
    if make_policy is not None:
        monkeypatch.setattr(node_module, 'make_policy', make_policy)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=next_domain_id())
    return context, VlaPolicyLifecycleNode(context=context, cli_args=[
        '--ros-args', '--params-file', str(DEFAULT_CONFIG), *RANDOM_WEIGHTS_ARGS])


def _close(context, node) -> None:
    import rclpy
    node.destroy_node()
    rclpy.try_shutdown(context=context)


def test_configure_loads_no_second_model_while_a_step_of_the_freed_one_runs(monkeypatch, capfd):
    """Cleanup leaves a blocked step running; configure waits a bounded time, fails and says why, then loads."""
    from rclpy.lifecycle import TransitionCallbackReturn

    from vla_policy_node.ros import lifecycle_node
    policies = []

    def make_policy(*_):
        policies.append(ScriptedPolicy(['block']))
        return policies[-1]

    monkeypatch.setattr(lifecycle_node, 'WORKER_STOP_S', 0.2)
    monkeypatch.setattr(lifecycle_node, 'ORPHAN_WAIT_S', 0.5)
    context, node = _lifecycle_node(monkeypatch, make_policy)
    try:
        assert node.on_configure(None) == TransitionCallbackReturn.SUCCESS
        assert node._worker.submit(ChunkRequest(0, 0, 0.0, 0, None), {})
        assert policies[0].started.wait(5.0)
        node.on_cleanup(None)
        assert not node.stop(), 'SIGINT would wait for a step that may never end'
        start = time.monotonic()
        assert node.on_configure(None) == TransitionCallbackReturn.FAILURE
        assert 0.5 <= time.monotonic() - start < 2.0
        assert len(policies) == 1, 'a second model was loaded beside the running step'
        logged = capfd.readouterr().err
        assert 'policy freed' not in logged and 'a policy step still runs' in logged, logged
        assert 'a second model is not loaded beside it' in logged, logged
        policies[0].release.set()
        assert node.on_configure(None) == TransitionCallbackReturn.SUCCESS and len(policies) == 2
        node.on_cleanup(None)
        assert 'policy freed' in capfd.readouterr().err
        assert node.stop()
    finally:
        policies[0].release.set()
        _close(context, node)


def test_stop_during_a_transition_does_not_report_finished(monkeypatch):
    """``main`` must not tear the node down under a transition still running on the executor's thread."""
    from vla_policy_node.ros import lifecycle_node
    context, node = _lifecycle_node()
    seen = []
    wire = node._wire

    def observed_wire():
        seen.append(node.stop())
        wire()

    monkeypatch.setattr(node, '_wire', observed_wire)
    try:
        assert node.on_configure(None) == lifecycle_node.TransitionCallbackReturn.SUCCESS
        assert seen == [False]
        node.on_cleanup(None)
        assert node.stop()
    finally:
        _close(context, node)


def test_a_transition_that_starts_while_stop_runs_waits_for_it():
    """A lifecycle manager shutting the node down on the same Ctrl-C must not free what stop() is using."""
    import threading

    context, node = _lifecycle_node()
    try:
        assert node.on_configure(None).name == 'SUCCESS' and node.on_activate(None).name == 'SUCCESS'
        loop_stop, order = node._loop.stop, []

        def slow_stop(now):
            order.append('stop begins')
            time.sleep(0.5)                     # the hold, waited for until acknowledged
            order.append('stop ends')
            return loop_stop(now)
        node._loop.stop = slow_stop
        stopper = threading.Thread(target=lambda: order.append(('stopped', node.stop())))
        stopper.start()
        while not order:
            time.sleep(0.01)
        node.on_shutdown(None)
        order.append('shutdown ran')
        stopper.join(5.0)
        assert order == ['stop begins', 'stop ends', ('stopped', True), 'shutdown ran'], order
    finally:
        _close(context, node)


def test_cleanup_frees_the_policy_without_a_garbage_collection(monkeypatch):
    """No reference cycle keeps the model: it is gone when cleanup returns, with the collector off."""
    from vla_policy_node.ros import lifecycle_node
    monkeypatch.setattr(lifecycle_node, '_release_memory', lambda: None)
    context, node = _lifecycle_node()
    gc.disable()
    try:
        node.on_configure(None)
        node.on_activate(None)
        node.on_deactivate(None)
        policy, model = weakref.ref(node._policy), weakref.ref(node._policy.model)
        node.on_cleanup(None)
        assert policy() is None and model() is None, 'cleanup left the policy to the garbage collector'
    finally:
        gc.enable()
        _close(context, node)


def test_the_instruction_is_subscribed_only_while_active_and_volatile():
    """No subscription can be handed a sample published before the activation."""
    context, node = _lifecycle_node()
    topic = node._settings.instruction_topic

    def instruction_subscriptions():
        return [sub for sub in node.subscriptions if sub.topic_name.endswith(topic)]

    try:
        node.on_configure(None)
        assert instruction_subscriptions() == []
        node.on_activate(None)
        subscription, = instruction_subscriptions()
        assert subscription.qos_profile.durability == DurabilityPolicy.VOLATILE
        node.on_deactivate(None)
        assert instruction_subscriptions() == []
        node.on_activate(None)
        node.on_deactivate(None)
        node.on_cleanup(None)
        assert instruction_subscriptions() == []
    finally:
        _close(context, node)


def test_sigint_while_the_plain_node_loads_exits_promptly():
    """The plain node loads in its constructor: a signal ends the build at once, not after the load."""
    node = NodeProcess([DEFAULT_CONFIG], next_domain_id(), env={'PLAIN_NODE': '1', 'SLOW_LOAD_S': '60'},
                       command=(sys.executable, str(ROOT / 'test' / 'scripted_lifecycle_node.py')))
    try:
        assert node.wait_for_output('SLOW LOAD', timeout=60.0), node.output
        start = time.monotonic()
        node.process.send_signal(signal.SIGINT)
        assert node.wait(10.0) == 0, node.output
        assert time.monotonic() - start < 5.0, node.output
        assert 'stopped before the node was ready' in node.output and 'Traceback' not in node.output, node.output
    finally:
        node.kill()


def test_cleanup_destroys_the_action_clients_of_action_groups_and_configure_makes_them_again():
    """An action client is a waitable, not a publisher: cleanup must not leave one behind per configure."""
    import rclpy
    from rclpy.action import ActionClient
    from rclpy.lifecycle import TransitionCallbackReturn

    from ros_harness import RANDOM_WEIGHTS_ARGS
    from test_action_outputs import GROUP_ARGS
    from vla_policy_node.ros.lifecycle_node import VlaPolicyLifecycleNode
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=next_domain_id())
    node = VlaPolicyLifecycleNode(context=context, cli_args=[
        '--ros-args', '--params-file', str(DEFAULT_CONFIG), *RANDOM_WEIGHTS_ARGS, *GROUP_ARGS])
    clients = lambda: sum(isinstance(w, ActionClient) for w in node.waitables)  # noqa: E731
    try:
        for _ in range(2):
            assert node.on_configure(None) == TransitionCallbackReturn.SUCCESS
            assert clients() == 2
            node.on_cleanup(None)
            assert clients() == 0
    finally:
        node.destroy_node()
        rclpy.try_shutdown(context=context)
