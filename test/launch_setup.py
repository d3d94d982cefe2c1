# SPDX-License-Identifier: Apache-2.0
"""
What the tests that run ``ros2 launch`` share: the skip without the launch tools, an ament prefix.

The launch tools (launch, launch_ros, launch_testing, ros2cli) are not on PyPI: ``make setup``
installs them from ``../shared/ros2-launch`` (or ``VLA_ROS2_LAUNCH_DIR``) when it is there, with
the verbs ``ros2 interface`` and ``ros2 action`` from ``tools/ros2cli``.
Without that folder, and without a ROS 2 installation that provides them, these tests skip
and say why; with the folder, a missing tool is a setup failure, not a skip.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
import shutil
import sys

import pytest

from vla_policy_node.ament_registration import register

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_DIR = Path(os.environ.get('VLA_ROS2_LAUNCH_DIR', ROOT.parent / 'shared' / 'ros2-launch'))
TOOLS = ('launch', 'launch_ros', 'launch_testing', 'ros2launch', 'ros2lifecycle', 'ros2interface', 'ros2action')


def require_launch_tools() -> None:
    """Skip the calling module when the launch tools are absent and nothing provides them."""
    missing = [name for name in TOOLS if importlib.util.find_spec(name) is None]
    if missing and not LAUNCH_DIR.is_dir():
        pytest.skip(f'{missing} not installed and {LAUNCH_DIR} not found: `make setup` installs the '
                    'ROS 2 launch tools from that folder (or set VLA_ROS2_LAUNCH_DIR)',
                    allow_module_level=True)
    assert not missing, f'{missing} not installed although {LAUNCH_DIR} exists: run `make setup`'


def ros2_command() -> str:
    """Return the ``ros2`` command of this environment (next to the interpreter, else on PATH)."""
    beside = Path(sys.executable).parent / 'ros2'
    return str(beside) if beside.exists() else (shutil.which('ros2') or 'ros2')


def ament_env(prefix: Path) -> dict[str, str]:
    """Register this checkout in ``prefix`` and return AMENT_PREFIX_PATH with it first."""
    register(prefix, ROOT, Path(sys.executable))
    rest = os.environ.get('AMENT_PREFIX_PATH', sys.prefix)
    return {'AMENT_PREFIX_PATH': os.pathsep.join([str(prefix), rest])}
