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

from collections import deque
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
class FaultReport:
    """Policy faults of the last diagnostics period: count per kind and the newest message."""

    counts: Mapping[str, int]
    last: str = ''

    @property
    def level(self) -> bytes:
        """ERROR when the policy failed during the period, OK otherwise."""
        return ERROR if any(self.counts.values()) else OK


class FaultTally:
    """
    Policy faults by kind: totals for the counters, and the recent ones for one report.

    Reports cover a sliding window (the diagnostics period), so every /diagnostics message
    says what went wrong since the previous one without anybody having to reset a counter,
    and a status taken for another purpose (the summary at exit) does not swallow a report.
    Not thread-safe: the node calls it under its lock.
    """

    def __init__(self, kinds: Sequence[str]) -> None:
        self._kinds = tuple(kinds)
        self.totals = dict.fromkeys(self._kinds, 0)
        self._recent: deque[tuple[float, str, str]] = deque(maxlen=1000)

    def add(self, kind: str, message: str, now: float) -> None:
        """Count one fault of ``kind`` seen at ``now`` (seconds)."""
        self.totals[kind] += 1
        self._recent.append((now, kind, message))

    def report(self, now: float, window: float) -> FaultReport:
        """Faults of the last ``window`` seconds before ``now``."""
        while self._recent and self._recent[0][0] < now - window:
            self._recent.popleft()
        counts = dict.fromkeys(self._kinds, 0)
        for _, kind, _ in self._recent:
            counts[kind] += 1
        last = self._recent[-1][2] if self._recent else ''
        return FaultReport(counts, last)


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
    policy_faults: FaultReport = FaultReport({})


def _value(value: object) -> str:
    return f'{value:.6g}' if isinstance(value, float) else str(value)


def status_to_diagnostics(status: NodeStatus, node_name: str, stamp: Time) -> DiagnosticArray:
    """Build the message: the policy loop, the policy's output, one status per input stream."""
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
    faults = status.policy_faults
    total = sum(faults.counts.values())
    array.status.append(DiagnosticStatus(
        level=faults.level, name=f'{node_name}: policy output', hardware_id=node_name,
        message=f'{total} faulty chunks discarded since the last report: {faults.last}'
        if total else 'ok',
        values=[KeyValue(key=kind, value=str(count)) for kind, count in faults.counts.items()]))
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
