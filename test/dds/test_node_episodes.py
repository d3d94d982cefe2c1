# SPDX-License-Identifier: Apache-2.0
"""
The node in this process with a scripted policy: torn state and policy faults, over DDS.

The node is the real VlaPolicyNode (parameters from default.yaml, real scheduler, worker,
limits and publishers); only ``make_policy`` is replaced by the scripted policy of
test_node_worker, whose chunk n is filled with 0.01 * n, so every trajectory point tells
which inference it came from. The robot probe publishes zero joint states, so no point is
clamped and a point's value is exactly its chunk's. Domains 120-129, loopback only.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from ros_harness import DEFAULT_CONFIG, RANDOM_WEIGHTS_ARGS, use_test_domain
from sensor_msgs.msg import JointState
from std_srvs.srv import Trigger
from test_node_integration import CONFIG, JOINTS, RobotProbe, wait_until
from test_node_worker import ScriptedPolicy

from vla_policy_node.ros import node as node_module

pytestmark = pytest.mark.dds


class ZeroRobot(RobotProbe):
    """The probe with every joint at 0.0 (chunk values stay unclamped)."""

    def _publish_joints(self) -> None:
        self._joints.publish(JointState(name=JOINTS, position=[0.0] * len(JOINTS)))

    def point_values(self) -> list[set[float]]:
        """Per command, the set of values (rounded) of all its trajectory points."""
        with self._lock:
            return [{round(v, 6) for p in c.points for v in p.positions} for c in self.commands]


@pytest.fixture
def running(monkeypatch):
    """Start the node in-process with a ScriptedPolicy; yield (node, policy, probe)."""
    domain_id = use_test_domain(monkeypatch)
    policy = ScriptedPolicy()
    monkeypatch.setattr(node_module, 'make_policy', lambda *_: policy)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain_id)
    node = node_module.VlaPolicyNode(
        context=context, cli_args=['--ros-args', '--params-file', str(DEFAULT_CONFIG), *RANDOM_WEIGHTS_ARGS])
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    probe = ZeroRobot(domain_id)
    try:
        yield node, policy, probe
    finally:
        policy.release.set()
        probe.close()
        node.stop()
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def test_reset_during_inference_never_executes_the_old_chunk(running):
    node, policy, probe = running
    policy.script = ['ok', 'block']
    assert wait_until(lambda: {0.01} in probe.point_values(), 15.0), 'chunk 1 never commanded'
    assert policy.started.wait(10.0)
    assert wait_until(lambda: ('predict', 2) in policy.calls, 5.0)
    assert probe.reset_client.wait_for_service(timeout_sec=5.0)
    futures = [probe.reset_client.call_async(Trigger.Request()) for _ in range(5)]
    result = node.set_parameters([Parameter('limits.max_step', value=0.09),
                                  Parameter('max_observation_age', value=0.45)])
    assert all(r.successful for r in result)
    assert wait_until(lambda: all(f.done() for f in futures), 5.0)
    assert node._loop._state.sent is not None, 'the step limit survives the reset'
    policy.release.set()
    assert wait_until(lambda: any(0.03 in v for v in probe.point_values()), 10.0)
    values = set().union(*probe.point_values())
    assert 0.02 not in values, 'a chunk of the old episode was executed in the new one'
    calls = policy.calls
    assert calls.index('reset') > calls.index(('predict', 2))
    assert calls.index('reset') < calls.index(('predict', 3)), 'prefix cache shared'
    assert wait_until(lambda: probe.counter('episode_resets') == 5, 5.0)
    assert probe.counter('chunks_discarded') >= 1
    assert node._settings.limits.max_step == 0.09


@pytest.mark.parametrize('fault, kind', [('raise', 'raised'), ('nan', 'non_finite')])
def test_policy_fault_holds_reports_once_and_the_next_step_retries(running, fault, kind):
    node, policy, probe = running
    policy.script = ['ok', fault, fault, fault, 'block']
    assert wait_until(lambda: {0.01} in probe.point_values(), 15.0)
    assert wait_until(lambda: ('predict', 5) in policy.calls, 10.0), policy.calls
    assert wait_until(lambda: probe.counter(f'policy_{kind}') == 3, 5.0)
    holds = probe.command_count()       # the hold went out at the first fault, before this report
    assert probe.state().startswith(f'holding: policy {kind}')
    output = probe.inputs_status['vla_policy_node: policy output']
    assert output['level'] == '2' and int(output[kind]) >= 1, output
    time.sleep(0.3)
    assert probe.command_count() == holds, 'commanded while the policy failed'
    values = np.array(probe.commands[-1].points[0].positions)
    np.testing.assert_allclose(values, 0.01, err_msg='the hold is the last safe command')
    policy.release.set()
    # The blocked step's chunk counts as stale if it took longer than max_observation_age.
    assert wait_until(lambda: any(v & {0.05, 0.06} for v in probe.point_values()), 10.0)
    assert wait_until(lambda: probe.state() == 'commanding', 5.0)
    if probe.counter('policy_stale') > 0:
        assert not any(0.05 in v for v in probe.point_values()), 'a stale chunk was executed'
    assert node.get_parameter('policy_deadline').value == CONFIG['policy_deadline']
