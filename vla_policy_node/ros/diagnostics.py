# SPDX-License-Identifier: Apache-2.0
"""
Node status -> ``diagnostic_msgs/DiagnosticArray`` for /diagnostics.

The control loop takes a :class:`NodeStatus` snapshot under its lock (levels from
``control.health``, the same numbers as the message's constants); turning it into a message is
pure and happens here, so rqt_robot_monitor, diagnostic_aggregator and the tests all read the
same key names. diagnostic_updater is not used: it is not available from PyPI and the node
needs nothing beyond one message per period.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from vla_policy_node.control.health import FaultReport, InputHealth
from vla_policy_node.control.inference import POLICY_STAGES
from vla_policy_node.control.real_time import RealTimeVerdict


@dataclass(frozen=True)
class NodeStatus:
    """
    A consistent snapshot of what the node reports once per diagnostics period.

    level: control.health level. counters: integer counters by key (control_steps,
    prefix_passes, commands_published, ...). latencies: stage -> (p50, p95) in seconds,
    for the stages in POLICY_STAGES.
    """

    state: str
    level: int
    model: str
    device: str
    counters: Mapping[str, int]
    latencies: Mapping[str, tuple[float, float]]
    inputs: Sequence[InputHealth] = field(default_factory=tuple)
    policy_faults: FaultReport = FaultReport({})
    max_action_age: float = 0.0
    last_chunk_latency: float | None = None
    real_time: RealTimeVerdict | None = None


def _level(level: int) -> bytes:
    return bytes([level])


def _value(value: object) -> str:
    return f'{value:.6g}' if isinstance(value, float) else str(value)


def status_prefix(fully_qualified_name: str) -> str:
    """
    Name the node's statuses by: ``vla_policy_node``, or ``robot1/vla_policy_node`` in a namespace.

    So two robots' statuses (``robot1/vla_policy_node: policy``, ``robot2/...``) never share a
    name on /diagnostics, and a node without a namespace keeps the plain name.
    """
    return fully_qualified_name.lstrip('/')


def status_to_diagnostics(status: NodeStatus, node_name: str, stamp: Time) -> DiagnosticArray:
    """Build the message: the policy loop, whether it keeps real time, the policy's output, one status per input."""
    array = DiagnosticArray()
    array.header.stamp = stamp
    values = [KeyValue(key='state', value=status.state),
              KeyValue(key='model', value=status.model),
              KeyValue(key='device', value=status.device)]
    values += [KeyValue(key=key, value=_value(count)) for key, count in status.counters.items()]
    for stage in POLICY_STAGES:
        p50, p95 = status.latencies.get(stage, (float('nan'), float('nan')))
        values.append(KeyValue(key=f'{stage}_latency_p50_ms', value=f'{p50 * 1e3:.2f}'))
        values.append(KeyValue(key=f'{stage}_latency_p95_ms', value=f'{p95 * 1e3:.2f}'))
    latency = status.last_chunk_latency
    values.append(KeyValue(key='chunk_latency_ms',
                           value='n/a' if latency is None else f'{latency * 1e3:.2f}'))
    values.append(KeyValue(key='max_action_age_ms', value=f'{status.max_action_age * 1e3:.1f}'))
    array.status.append(DiagnosticStatus(
        level=_level(status.level), name=f'{node_name}: policy', message=status.state,
        hardware_id=node_name, values=values))
    verdict = status.real_time
    if verdict is not None:
        needed = 'n/a' if verdict.needed_threshold is None else f'{verdict.needed_threshold:.4g}'
        array.status.append(DiagnosticStatus(
            level=_level(verdict.level), name=f'{node_name}: real time', message=verdict.message,
            hardware_id=node_name, values=[KeyValue(key='refill_threshold_needed', value=needed)]))
    faults = status.policy_faults
    total = sum(faults.counts.values())
    array.status.append(DiagnosticStatus(
        level=_level(faults.level), name=f'{node_name}: policy output', hardware_id=node_name,
        message=f'{total} faulty chunks discarded since the last report: {faults.last}'
        if total else 'ok',
        values=[KeyValue(key=kind, value=str(count)) for kind, count in faults.counts.items()]))
    for health in status.inputs:         # no age: nothing received yet, or latched (the instruction)
        array.status.append(DiagnosticStatus(
            level=_level(health.level), name=f'{node_name}: input {health.name}',
            message=health.message, hardware_id=node_name,
            values=[] if health.age_s is None else [KeyValue(key='age_s', value=f'{health.age_s:.3f}')]))
    return array


def diagnostics_to_dict(array: DiagnosticArray) -> dict[str, dict[str, str]]:
    """
    Flatten a DiagnosticArray to {status name: {key: value}} (with 'level' and 'message').

    The node's own summary on exit, the simulated robot's demo summary and the tests read
    diagnostics through this one function.
    """
    flat = {}
    for status in array.status:
        entry = {value.key: value.value for value in status.values}
        entry['level'] = str(ord(status.level))
        entry['message'] = status.message
        flat[status.name] = entry
    return flat
