"""
Node status -> ``diagnostic_msgs/DiagnosticArray`` for /diagnostics.

Levels are the message's own constants (``bytes`` of length one), so ``max`` of several
levels is the worst of them.

The node gathers a :class:`NodeStatus` snapshot under its lock; turning it into a message
is pure and happens here, so rqt_robot_monitor, diagnostic_aggregator and the tests all read
the same key names. diagnostic_updater is not used: it is not available from PyPI and the
node needs nothing beyond one message per period.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

OK = DiagnosticStatus.OK
WARN = DiagnosticStatus.WARN
ERROR = DiagnosticStatus.ERROR

LATENCY_STAGES = ('prefix', 'denoise', 'total')


@dataclass(frozen=True)
class InputHealth:
    """Health of one input stream (a camera, the joint states or the instruction)."""

    name: str
    level: bytes
    message: str
    age_s: float | None = None


@dataclass(frozen=True)
class NodeStatus:
    """
    A consistent snapshot of what the node reports once per diagnostics period.

    counters: integer counters by key (control_steps, prefix_passes, commands_published, ...).
    latencies: stage -> (p50, p95) in seconds, for the stages in LATENCY_STAGES.
    """

    state: str
    level: bytes
    model: str
    device: str
    counters: Mapping[str, int]
    latencies: Mapping[str, tuple[float, float]]
    inputs: Sequence[InputHealth] = field(default_factory=tuple)


def _value(value: object) -> str:
    return f'{value:.6g}' if isinstance(value, float) else str(value)


def status_to_diagnostics(status: NodeStatus, node_name: str, stamp: Time) -> DiagnosticArray:
    """Build the message: one status for the policy loop, one per input stream."""
    array = DiagnosticArray()
    array.header.stamp = stamp
    values = [KeyValue(key='state', value=status.state),
              KeyValue(key='model', value=status.model),
              KeyValue(key='device', value=status.device)]
    values += [KeyValue(key=key, value=_value(count)) for key, count in status.counters.items()]
    for stage in LATENCY_STAGES:
        p50, p95 = status.latencies.get(stage, (float('nan'), float('nan')))
        values.append(KeyValue(key=f'{stage}_latency_p50_ms', value=f'{p50 * 1e3:.2f}'))
        values.append(KeyValue(key=f'{stage}_latency_p95_ms', value=f'{p95 * 1e3:.2f}'))
    array.status.append(DiagnosticStatus(
        level=status.level, name=f'{node_name}: policy', message=status.state,
        hardware_id=node_name, values=values))
    for health in status.inputs:
        age = 'never received' if health.age_s is None else f'{health.age_s:.3f}'
        array.status.append(DiagnosticStatus(
            level=health.level, name=f'{node_name}: input {health.name}',
            message=health.message, hardware_id=node_name,
            values=[KeyValue(key='age_s', value=age)]))
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
