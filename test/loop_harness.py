# SPDX-License-Identifier: Apache-2.0
"""A scripted stand-in for the inference thread, for tests of the ROS-free control loop."""

from __future__ import annotations

import numpy as np

from vla_policy_node.control.inference import InferenceResult


class ScriptedInference:
    """Keeps the one request in flight until the test delivers a result for it."""

    def __init__(self) -> None:
        self.pending = None
        self.observations: list[dict] = []
        self.resets = 0
        self.on_result = None

    @property
    def busy(self) -> bool:
        return self.pending is not None

    def bind(self, on_result) -> None:
        self.on_result = on_result

    def submit(self, request, observation) -> bool:
        assert self.pending is None
        assert np.all(np.isfinite(observation['state'])), 'a bad state reached the policy'
        self.pending = request
        self.observations.append(observation)
        return True

    def request_reset(self) -> None:
        self.resets += 1

    def deliver(self, chunk, fault, now) -> float | None:
        """Hand back the request in flight (chunk, or a fault kind) at ``now``; its obs time."""
        request, self.pending = self.pending, None
        if request is None:
            return None
        self.on_result(InferenceResult(request, None if fault else chunk, fault,
                                       'scripted' if fault else '', 0.01, now))
        return request.obs_time
