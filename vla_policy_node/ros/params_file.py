# SPDX-License-Identifier: Apache-2.0
"""
The parameter-file reader: what the files and ``-p`` flags of a start give a node, read as rcl reads them.

Kept beside rcl because rcl merges every source before the node sees it and silently keeps the
first of two differently typed values; reading them again here lets the start-up refuse the bad
one with its file in the message, and lets ``vla-policy-replay`` read the node's files.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
import re
from typing import Any

from rclpy.parameter import Parameter
import yaml

from vla_policy_node.ros.param_specs import _type_name, ParameterError, PARAMETERS, ParamSpec


# rcl's YAML rules for an unquoted scalar (rcl_yaml_param_parser get_value): these words are
# booleans, then whatever strtol or strtod reads completely is an integer or a double.
_YAML_BOOLS = {'y', 'yes', 'true', 'on', 'n', 'no', 'false', 'off'}
_YAML_SPECIAL_DOUBLES = {'.nan', '.inf', '-.inf', '+.inf'}
_ARRAY_TYPES = {
    Parameter.Type.BOOL: Parameter.Type.BOOL_ARRAY,
    Parameter.Type.INTEGER: Parameter.Type.INTEGER_ARRAY,
    Parameter.Type.DOUBLE: Parameter.Type.DOUBLE_ARRAY,
    Parameter.Type.STRING: Parameter.Type.STRING_ARRAY,
}


def check_override_sources(arguments: Sequence[str], node_name: str,
                           specs: Sequence[ParamSpec] = PARAMETERS) -> None:
    """
    Type-check every value the parameter files and ``-p`` flags in ``arguments`` give.

    rcl merges all sources before the node sees them, and when two sources give one name
    values of different types it silently keeps the first (``control_rate_hz: "fast"`` in a
    second file leaves the 20.0 of the first): the declared descriptors never see the bad
    value. So the sources are read again here and any value whose YAML type is not the
    declared one stops the start with the file and the value in the message. Names that are
    not declared are left to the unknown-parameter check.
    """
    by_name = {spec.name: spec for spec in specs}
    for source, name, node in _override_values(arguments, node_name):
        spec = by_name.get(name)
        if spec is None:
            continue
        kind = _yaml_type(node)
        if kind != spec.type:
            raise ParameterError(
                f"parameter '{name}' {spec.requirement()}, but {source} gives "
                f'{_describe_yaml(kind, node)}')


def _override_values(arguments: Sequence[str],
                     node_name: str) -> Iterator[tuple[str, str, yaml.Node]]:
    """(source, parameter name, YAML value) of every override in the ROS arguments."""
    ros_args = False
    tokens = iter(arguments)
    for token in tokens:
        if token == '--ros-args':
            ros_args = True
        elif token == '--':
            ros_args = False
        elif ros_args and token == '--params-file':
            path = next(tokens, '')
            yield from _params_file_values(path, node_name)
        elif ros_args and token in ('-p', '--param'):
            assignment = next(tokens, '')
            name, _, text = assignment.partition(':=')
            target, _, name = name.rpartition(':')
            if not target or _node_matches(target, node_name):
                yield f'-p {assignment}', name, yaml.compose(text or "''")


def read_params_file(path: str, node_name: str) -> dict[str, Any]:
    """
    Return the values a parameter file gives the node ``node_name`` (fully qualified).

    Sections are matched as rcl matches them (``/**``, ``/ns/node``, ``node``, wildcards) and
    applied in file order, later values winning; values are read as YAML, names flattened
    (``limits: {max_step: 0.1}`` -> ``limits.max_step``). The one reader of parameter files
    beside rcl: the type check of the start-up and ``vla_policy_replay`` both use it.
    """
    return {name: yaml.safe_load(yaml.serialize(node)) for _, name, node in _params_file_values(path, node_name)}


def _params_file_values(path: str, node_name: str) -> Iterator[tuple[str, str, yaml.Node]]:
    try:
        with open(path, encoding='utf-8') as stream:
            root = yaml.compose(stream)
    except (OSError, yaml.YAMLError) as error:
        raise ParameterError(f'cannot read parameter file {path}: {error}') from error
    if not isinstance(root, yaml.MappingNode):
        return
    for key, section in root.value:
        if not _node_matches(key.value, node_name) or not isinstance(section, yaml.MappingNode):
            continue
        for inner_key, tree in section.value:
            if inner_key.value == 'ros__parameters':
                for name, value in _flatten(tree, ''):
                    yield path, name, value


def _flatten(node: yaml.Node, prefix: str) -> Iterator[tuple[str, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        yield prefix[:-1], node
        return
    for key, value in node.value:
        yield from _flatten(value, f'{prefix}{key.value}.')


def _node_matches(pattern: str, node_name: str) -> bool:
    """Match rcl's node-name wildcards: ``**`` any number of name tokens, ``*`` exactly one."""
    pattern = pattern if pattern.startswith('/') else '/' + pattern
    regex = re.escape(pattern).replace(r'/\*\*', '(/[^/]+)*').replace(r'\*', '[^/]+')
    return re.fullmatch(regex, node_name) is not None


def _yaml_type(node: yaml.Node) -> Parameter.Type:
    if isinstance(node, yaml.SequenceNode):
        kinds = {_yaml_type(item) for item in node.value}
        if len(kinds) == 1 and next(iter(kinds)) in _ARRAY_TYPES:
            return _ARRAY_TYPES[kinds.pop()]
        return Parameter.Type.NOT_SET
    if not isinstance(node, yaml.ScalarNode):
        return Parameter.Type.NOT_SET
    text = node.value
    if node.style is not None:
        return Parameter.Type.STRING
    if text.lower() in _YAML_BOOLS:
        return Parameter.Type.BOOL
    if re.fullmatch(r'[-+]?[0-9]+', text.strip()):
        return Parameter.Type.INTEGER
    if text.lower() in _YAML_SPECIAL_DOUBLES:
        return Parameter.Type.DOUBLE
    try:
        float(text)
    except ValueError:
        return Parameter.Type.STRING
    return Parameter.Type.DOUBLE


def _describe_yaml(kind: Parameter.Type, node: yaml.Node) -> str:
    if kind == Parameter.Type.NOT_SET:
        return 'a value of no single parameter type'
    text = node.value if isinstance(node, yaml.ScalarNode) else '[...]'
    article = 'an' if _type_name(kind)[0] in 'aeiou' else 'a'
    return f'{article} {_type_name(kind)} ({text!r})'
