# SPDX-License-Identifier: Apache-2.0
"""A policy stand-in that does what a script says: for the worker tests and the scripted nodes."""

from __future__ import annotations

import threading
import time

import numpy as np

CHUNK, JOINTS = 8, 6  # six joints, as in default.yaml


class ScriptedStats:
    """The counters and latencies the worker snapshots from a policy."""

    control_steps = prefix_passes = denoise_steps = cache_resets = 0

    def latency(self, stage: str) -> tuple[float, float]:
        return (0.001, 0.002)


class ScriptedPolicy:
    """
    Does what ``script`` says, one entry per predict call (then 'ok').

    'ok': a chunk filled with the call number; 'raise'; 'nan'; ('sleep', s); 'block': wait
    for ``release``. ``calls`` records ('predict', n) and 'reset' in order.
    """

    chunk_size = CHUNK
    device = 'cpu'
    family = 'scripted'

    def __init__(self, script=()) -> None:
        self.script = list(script)
        self.calls: list = []
        self.stats = ScriptedStats()
        self.started = threading.Event()
        self.release = threading.Event()
        self._count = 0

    def predict_action_chunk(self, observation, rtc=None):
        self._count += 1
        n = self._count
        self.calls.append(('predict', n))
        self.stats.control_steps += 1
        action = self.script.pop(0) if self.script else 'ok'
        self.started.set()
        if action == 'raise':
            raise RuntimeError('scripted failure')
        if action == 'block':
            assert self.release.wait(10.0)
        if isinstance(action, tuple):
            time.sleep(action[1])
        chunk = np.full((1, CHUNK, JOINTS), 0.01 * n, dtype=np.float32)
        if action == 'nan':
            chunk[0, 3, 1] = np.nan
        return chunk

    def reset(self) -> None:
        self.calls.append('reset')
        self.stats.cache_resets += 1
