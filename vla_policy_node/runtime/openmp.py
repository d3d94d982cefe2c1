# SPDX-License-Identifier: Apache-2.0
"""
One OpenMP thread team per process: release the team a thread built while it loaded the model.

Every thread that runs a parallel torch op keeps its own OpenMP team. The node loads and warms
up the policy on one thread and runs it on another (``control.inference``), so it held two
teams. GNU OpenMP (libgomp, torch's on Linux) counts the threads of every team, and when they
outnumber the CPUs it stops spinning between parallel regions and sleeps: on a 2-CPU machine
each of a chunk's ~7,500 regions then waited for a futex wake-up, and the full-size int8 chunk
took 0.66 s on the inference thread against 0.46 s with the loading thread's team released
(AMD EPYC, 2 vCPUs, 2026-12-06; BENCHMARKS.md). The release ends the calling thread's team
only; it is built again if that thread runs a parallel op later.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

OMP_PAUSE_SOFT = 1      # omp_pause_resource_t: release threads, keep nothing that must be rebuilt


def _libgomp() -> ctypes.CDLL | None:
    """Return the libgomp this process has loaded (torch's own copy), or None (another OpenMP, or none)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = {line.split()[-1] for line in maps.splitlines() if "libgomp" in line.rsplit("/", 1)[-1]}
    for path in sorted(paths):
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        if hasattr(library, "omp_pause_resource_all"):
            return library
    return None


def release_thread_team() -> bool:
    """
    End the calling thread's OpenMP team (its pool threads exit); return whether it was released.

    False where torch does not run on libgomp (Intel OpenMP, macOS) or the thread is inside a
    parallel region: nothing changes then.
    """
    library = _libgomp()
    if library is None:
        return False
    library.omp_pause_resource_all.argtypes = [ctypes.c_int]
    return library.omp_pause_resource_all(OMP_PAUSE_SOFT) == 0
