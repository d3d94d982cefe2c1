# SPDX-License-Identifier: Apache-2.0
"""The loading thread's OpenMP team is released, so the inference thread's is the process's only one."""

from __future__ import annotations

import os
import threading
import time

import torch

from vla_policy_node.runtime import openmp


def threads_alive() -> int:
    return len(os.listdir("/proc/self/task"))


def in_fresh_thread(fn):
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as error:          # re-raised in the test's thread
            out["error"] = error

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(60)
    if "error" in out:
        raise out["error"]
    return out["value"]


def settled_count(expected: int, timeout: float = 2.0) -> int:
    """Return the thread count once it reaches ``expected`` (exiting threads leave /proc a moment later)."""
    deadline = time.monotonic() + timeout
    while (count := threads_alive()) != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return count


def test_torch_here_runs_on_libgomp():
    assert openmp._libgomp() is not None, "this torch build has no libgomp: the release would do nothing"


def test_release_ends_the_calling_threads_team_and_a_later_op_builds_it_again():
    def scenario() -> tuple[int, int, bool, int, float]:
        torch.set_num_threads(2)
        before = threads_alive()
        x = torch.ones(4_000_000)
        x.add_(1)                               # parallel regions: this thread's team of 2 (one new thread)
        with_team = threads_alive()
        released = openmp.release_thread_team()
        after = settled_count(with_team - 1)
        x.add_(1)                               # the team is built again on demand, and the result is right
        return before, with_team, released, after, float(x[0])

    before, with_team, released, after, value = in_fresh_thread(scenario)
    assert with_team == before + 1
    assert released
    assert after == with_team - 1
    assert value == 3.0
