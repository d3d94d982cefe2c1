# SPDX-License-Identifier: Apache-2.0
"""run_until_signal: the node spins with a short GIL switch interval, and ends when its worker ends."""

from __future__ import annotations

import signal
import sys

import pytest
from ros_harness import use_test_domain

from vla_policy_node.ros import process

pytestmark = pytest.mark.dds


class ProbeNode:
    """A real rclpy node whose worker 'ends' after the first look; records the switch interval it ran under."""

    def __init__(self) -> None:
        from rclpy.node import Node
        self.node = Node('process_probe')
        self.seen: list[float] = []
        self.stopped = False

    def __getattr__(self, name: str):
        return getattr(self.node, name)

    def stop(self) -> bool:
        self.stopped = True
        return True


def test_the_node_spins_with_the_short_switch_interval_and_stops_when_its_worker_ends(monkeypatch):
    use_test_domain(monkeypatch)
    default = sys.getswitchinterval()
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    built: list[ProbeNode] = []

    def alive(node: ProbeNode) -> bool:
        node.seen.append(sys.getswitchinterval())
        return False

    try:
        code = process.run_until_signal(lambda: built.append(ProbeNode()) or built[-1], alive, 'process_probe', [])
    finally:
        sys.setswitchinterval(default)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert code == 1
    assert built[0].stopped
    assert built[0].seen == [process.GIL_SWITCH_INTERVAL_S]
    assert process.GIL_SWITCH_INTERVAL_S < default
