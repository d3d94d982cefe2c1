# SPDX-License-Identifier: Apache-2.0
"""
``~/tick_done``: with ``use_sim_time``, the simulated time of each control tick the node has finished.

A simulator in lockstep (``ros/sim/robot.py``) steps its physics one control period, publishes
``/clock`` and its sensors, and waits for this answer before the next step, so the node's
inference latency costs no simulated time: the arm never lags its commands nor starves for
want of CPU. A tick is answered once it has run (commanded or held, whatever the reason) and
the policy computes nothing: a tick that starts a chunk, or finds one being computed, is
answered when that chunk is in (used, refused or failed). A node that holds for any other
reason still answers every tick, so only a dead or stuck node stops the simulator (which
then steps on after a wall-clock bound and says so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from builtin_interfaces.msg import Time
from rclpy.node import Node

from vla_policy_node.ros.qos import TICK_DONE_QOS


class TickAnswers:
    """Publish each finished control tick's time; a tick waits for the chunk being computed."""

    def __init__(self, node: Node, busy: Callable[[], bool]) -> None:
        """``busy``: whether the inference computes a chunk now."""
        self._node = node
        self._busy = busy
        self._publisher = node.create_publisher(Time, '~/tick_done', TICK_DONE_QOS)
        self._pending: Time | None = None
        self._result_in = node.create_guard_condition(self._flush)

    def ticked(self) -> None:
        """Answer the tick that just ran, now or once its chunk is in (the executor's thread)."""
        self._pending = self._node.get_clock().now().to_msg()
        self._flush()

    def follow(self, loop: Any, inference: Any) -> None:
        """Answer a tick waiting for its chunk once ``loop`` has it: ``inference``'s results pass through here."""
        def take(result: Any) -> None:
            loop.on_inference_result(result)
            self.result_in()
        inference.bind(take)

    def result_in(self) -> None:
        """Note that the inference handed a result over (any thread): a waiting tick is answered."""
        self._result_in.trigger()

    def _flush(self) -> None:
        if self._pending is not None and not self._busy():
            self._publisher.publish(self._pending)
            self._pending = None
