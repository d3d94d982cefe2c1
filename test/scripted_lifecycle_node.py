# SPDX-License-Identifier: Apache-2.0
"""
Run the real lifecycle node's ``main`` with a scripted policy whose load or first step is slow.

Used by the lifecycle signal tests to stop the node while configure loads a model, or after
a cleanup left a step running, which the tiny model (loaded in a second, a few ms per step)
cannot be made to do. Both keep torch busy rather than sleep: a thread inside torch is what
made a normal interpreter exit abort. ``SLOW_LOAD_S`` and ``SLOW_STEP_S`` (seconds, default 0)
set how long; the markers ``SLOW LOAD`` and ``SLOW STEP`` are printed when each begins.
``PLAIN_NODE=1`` runs the plain node's ``main`` instead. Everything but the policy is the
installed node's code.
"""

import os
import sys
import time

from scripted_policy import ScriptedPolicy
import torch

from vla_policy_node.ros import lifecycle_node, node


def _busy(seconds: float) -> None:
    """Keep torch computing for ``seconds``, on one of its threads: the node's own threads keep a core."""
    matrix = torch.ones(256, 256)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        matrix @ matrix


class SlowFirstStepPolicy(ScriptedPolicy):
    """A scripted policy whose first step computes for ``SLOW_STEP_S``."""

    def predict_action_chunk(self, observation, rtc=None):
        if self._count == 0:
            print('SLOW STEP', flush=True)
            _busy(float(os.environ.get('SLOW_STEP_S', '0')))
        return super().predict_action_chunk(observation, rtc)


def _make_policy(*_) -> SlowFirstStepPolicy:
    print('SLOW LOAD', flush=True)
    _busy(float(os.environ.get('SLOW_LOAD_S', '0')))
    return SlowFirstStepPolicy()


if __name__ == '__main__':
    torch.set_num_threads(1)    # two spinning torch threads on 2 cores starved the signal handling in the suite
    node.make_policy = _make_policy
    sys.exit((node.main if os.environ.get('PLAIN_NODE') == '1' else lifecycle_node.main)())
