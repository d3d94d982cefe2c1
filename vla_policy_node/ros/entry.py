# SPDX-License-Identifier: Apache-2.0
"""Console entry point of the node: signal handling in place before the heavy imports."""

import os
import signal
import sys


def _exit_before_start(signum: int, frame: object) -> None:
    # Nothing has been commanded before the node exists, so there is nothing to hold. Exit at
    # once rather than raise: an exception raised inside an import running C code (numpy's
    # PyCapsule_Import of datetime) came out as an ImportError with a traceback and status 1.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> int:
    """
    Import rclpy, torch and the node only after SIGINT/SIGTERM exit cleanly.

    Importing torch takes seconds; a signal in that window would otherwise kill the
    process with the default action (a traceback or a non-zero status).
    """
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _exit_before_start)
    from vla_policy_node.ros.node import main as node_main
    return node_main()


def server_main() -> int:
    """Start ``vla_policy_server`` the same way (signals first, then the heavy imports)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _exit_before_start)
    from vla_policy_node.ros.server.node import main as server
    return server()


def lifecycle_main() -> int:
    """Run the managed lifecycle node (``ros.lifecycle_node``), with the same early signal handling."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _exit_before_start)
    from vla_policy_node.ros.lifecycle_node import main as node_main
    return node_main()
