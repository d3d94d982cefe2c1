# SPDX-License-Identifier: Apache-2.0
"""The one signal/spin/shutdown sequence every ``main()`` runs its node under (order is safety-relevant)."""

from __future__ import annotations

from collections.abc import Callable
import os
import signal
import sys
import threading
from typing import Any

import rclpy
from rclpy.exceptions import ParameterException
from rclpy.executors import SingleThreadedExecutor
from rclpy.signals import SignalHandlerOptions

from vla_policy_node.ros.params import ParameterError
from vla_policy_node.ros.policy_loader import PolicyLoadError


# How soon a thread waiting for the GIL makes its holder let go (Python's default: 5 ms). The
# inference thread takes the GIL back after each of a chunk's thousands of torch ops; when the
# executor thread held it then, the inference thread (and the core its OpenMP team waits on)
# waited up to the whole interval. At 0.5 ms the full-size int8 closed loop's chunk p50 went from
# 0.85-0.96 s to 0.76-0.78 s (BENCHMARKS.md, AMD EPYC, 2 vCPUs, 2026-12-06).
GIL_SWITCH_INTERVAL_S = 0.0005


class StopRequested(BaseException):
    """SIGINT/SIGTERM while the node is still being built: nothing was commanded, so nothing to hold."""


def run_until_signal(build: Callable[[], Any], alive: Callable[[Any], bool], logger_name: str,
                     args: list[str] | None = None) -> int:
    """
    Build a node, spin it until SIGINT/SIGTERM, stop it, then shut down; return the exit code.

    Exit 0 after a signal, 1 on a configuration error (``ParameterError``, ``PolicyLoadError``)
    or when ``alive(node)`` turns false (a callback raised and ended the executor thread, or
    the node's own worker ended): the node is stopped (``node.stop()``, which publishes the
    hold) before anything is shut down either way.

    rclpy's own signal handling would shut the context down before the hold could be sent,
    so the handlers are installed here and the shutdown runs in order. While the node is
    still being built (loading and warming up a model can take minutes) a signal ends the
    build at once: ``StopRequested`` derives from BaseException, so no ``except Exception``
    on the way keeps it. Further signals are ignored: Python's finalisation would restore
    their default action (death by the signal) for a second Ctrl-C while the process exits.
    """
    try:
        rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    except RuntimeError as error:   # RCLError: rcl refused the command line (a params file, -p, -r, --log-level)
        reason = str(error).removeprefix('failed to initialize rcl: ').split(', at ')[0]
        print(f'[FATAL] [{logger_name}]: cannot start: the ROS arguments: {reason}', file=sys.stderr)
        return 1
    stop = threading.Event()
    building = threading.Event()
    building.set()
    signals = (signal.SIGINT, signal.SIGTERM)

    def on_signal(*_: Any) -> None:
        stop.set()
        for signum in signals:
            signal.signal(signum, signal.SIG_IGN)
        if building.is_set():
            raise StopRequested

    for signum in signals:
        signal.signal(signum, on_signal)
    try:
        node = build()
        building.clear()
    except (ParameterError, PolicyLoadError, ParameterException) as error:   # the last: rclpy's own (use_sim_time)
        rclpy.logging.get_logger(logger_name).fatal(f'cannot start: {error}')
        rclpy.try_shutdown()
        return 1
    except StopRequested:
        rclpy.logging.get_logger(logger_name).info('stopped before the node was ready: nothing was commanded')
        rclpy.try_shutdown()
        return 0
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, name='executor', daemon=True)
    spinner.start()
    while not stop.wait(0.1) and spinner.is_alive() and alive(node):
        pass
    code = 0 if stop.is_set() else 1
    finished = node.stop()
    executor.shutdown(timeout_sec=1.0)
    spinner.join(1.0)
    if spinner.is_alive():
        # A callback still runs (a lifecycle transition loading a model): the node and the
        # context stay as they are under it, the process ends below.
        finished = False
    else:
        node.destroy_node()
        rclpy.try_shutdown()
    if not finished:
        # A thread still inside torch would abort the interpreter's finalisation; everything
        # that matters (the hold, or nothing commanded at all) is done.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
