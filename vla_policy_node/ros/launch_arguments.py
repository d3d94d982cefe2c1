# SPDX-License-Identifier: Apache-2.0
"""
Node parameters for launch files as ``--ros-args`` arguments.

launch_ros writes each parameter dict given to a node (``parameters=[{...}]``) to a temporary
file it never removes. The package's launch files pass parameter files as ``--params-file``
and values as ``-p name:=value`` instead, in order, the later winning as with ``parameters``.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Union

import yaml


def ros_arguments(*sources: Union[str, Mapping[str, Any]]) -> list[str]:
    """Return ``--params-file PATH`` for each path and ``-p name:=value`` for each value of each dict."""
    arguments: list[str] = []
    for source in sources:
        if isinstance(source, Mapping):
            for name, value in _flatten(source):
                arguments += ['-p', f'{name}:={yaml_value(value)}']
        else:
            arguments += ['--params-file', str(source)]
    return arguments


def yaml_value(value: Any) -> str:
    """Write ``value`` as rcl reads a ``-p`` value: flow YAML, strings quoted where they would not stay strings."""
    text = yaml.safe_dump(value, default_flow_style=True, width=2 ** 31)
    return text.removesuffix('\n...\n').strip()


def _flatten(values: Mapping[str, Any], prefix: str = '') -> Iterator[tuple[str, Any]]:
    """Nested YAML parameters -> dotted ROS parameter names, as in a parameter file."""
    for key, value in values.items():
        if isinstance(value, Mapping):
            yield from _flatten(value, f'{prefix}{key}.')
        else:
            yield f'{prefix}{key}', value
