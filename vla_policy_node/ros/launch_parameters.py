# SPDX-License-Identifier: Apache-2.0
"""
Node parameters a launch file sets on top of its parameter files.

launch_ros writes each parameter dict given to a node (``parameters=[{...}]``) to a file in
the system temp folder that it never removes. The package's launch files write those values
to a folder of their own instead, removed when the launch shuts down, each file keyed by its
node's full name, as launch_ros keys them: a node's own section takes precedence over the
``/**`` section of a parameter file on every ROS 2 distribution, so these values win.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Mapping

import yaml


class _QuotedStrings(yaml.SafeDumper):
    """Quote every string: rcl reads ``y``, ``n``, ``1e5`` or ``inf`` unquoted as a bool or a double."""


_QuotedStrings.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    'tag:yaml.org,2002:str', text, style="'"))


def full_name(namespace: str, name: str) -> str:
    """Return the node's fully qualified name (``/arm/vla_policy_node``)."""
    namespace = namespace.strip('/')
    return f'/{namespace}/{name}' if namespace else f'/{name}'


class LaunchParameters:
    """Parameter files for the nodes of one launch, in a folder removed when the launch shuts down."""

    def __init__(self) -> None:
        self.folder: str | None = None          # made with the first file

    def file(self, namespace: str, name: str, values: Mapping[str, Any]) -> str:
        """Write ``values`` (nested dicts allowed) for the node ``namespace/name``; return the path."""
        if self.folder is None:
            self.folder = tempfile.mkdtemp(prefix='vla_policy_launch_')
        node = full_name(namespace, name)
        handle, path = tempfile.mkstemp(prefix=node.strip('/').replace('/', '.') + '.', suffix='.yaml',
                                        dir=self.folder)
        with os.fdopen(handle, 'w') as f:
            yaml.dump({node: {'ros__parameters': dict(values)}}, f, Dumper=_QuotedStrings)
        return path

    def remove_at_shutdown(self) -> Any:
        """Return the launch action that removes the folder when the launch shuts down."""
        from launch.actions import RegisterEventHandler
        from launch.event_handlers import OnShutdown
        return RegisterEventHandler(OnShutdown(on_shutdown=lambda event, context: self.remove()))

    def remove(self) -> None:
        """Remove the folder and its files."""
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
