# SPDX-License-Identifier: Apache-2.0
"""
Start vla_policy_node with config/default.yaml (or another parameter file).

Launch arguments (``ros2 launch vla_policy_node vla_policy.launch.py --show-args``):
``config_file``, ``namespace``, ``lifecycle`` and the overrides ``checkpoint``, ``device``,
``use_sim_time``. An override is passed to the node only when it is given, so the config
file's values stand otherwise; an argument this file does not declare is an error (a typo
such as ``checkpont:=`` must not start the node without its checkpoint). The launch shuts
down when the node exits, and ``ros2 launch`` exits non-zero when the node failed. Topics are
relative: ``namespace:=arm`` makes the node read ``/arm/joint_states``. For example
``ros2 launch vla_policy_node vla_policy.launch.py config_file:=my_robot.yaml
checkpoint:=lerobot/smolvla_base device:=cuda namespace:=arm``.

Included from another launch file, give it its own scope so that the parent's launch
configurations do not count as arguments of this file: ``GroupAction([IncludeLaunchDescription(
..., launch_arguments=...)], scoped=True, forwarding=False)``.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction, RegisterEventHandler, Shutdown
from launch.event_handlers import OnProcessExit
from launch.events.process import ProcessExited
from launch_ros.actions import LifecycleNode, Node

from vla_policy_node.ros.launch_parameters import LaunchParameters

PACKAGE = 'vla_policy_node'
# name -> (description, parameter type); given only when set on the command line.
OVERRIDES = {
    'checkpoint': ('Checkpoint folder or Hugging Face hub id (from the local cache); '
                   'default: the config file\'s.', str),
    'device': ('Torch device: auto, cpu, cuda, cuda:N; default: the config file\'s.', str),
    'use_sim_time': ('true: use the /clock topic; default: the config file\'s (else false).',
                     bool),
}
BOOLEANS = {'true': True, 'false': False}


def _parse(name: str, text: str, kind: type) -> object:
    if kind is bool:
        if text.lower() not in BOOLEANS:
            raise ValueError(f"launch argument {name}:={text} must be true or false")
        return BOOLEANS[text.lower()]
    return text


def _on_node_exit(event: ProcessExited, context: LaunchContext) -> list:
    """Shut the launch down with the node; a failed node makes ``ros2 launch`` exit non-zero."""
    if context.is_shutdown:         # the launch is ending anyway (Ctrl-C): nothing to add
        return []
    if event.returncode != 0:
        raise RuntimeError(f'{event.action.name} exited with code {event.returncode}')
    return [Shutdown(reason=f'{event.action.name} exited')]


def _node(context: LaunchContext, declared: tuple[str, ...]) -> list:
    configurations = context.launch_configurations
    unknown = sorted(set(configurations) - set(declared))
    if unknown:
        raise ValueError(
            f'unknown launch arguments {unknown}; this file takes {sorted(declared)} '
            '(ros2 launch vla_policy_node vla_policy.launch.py --show-args)')
    config_file = configurations['config_file']
    if not os.path.isfile(config_file):        # launch_ros would drop it with a warning
        raise ValueError(f'config_file {config_file!r} is not a file')
    overrides = {name: _parse(name, configurations[name], kind)
                 for name, (_, kind) in OVERRIDES.items() if configurations.get(name, '') != ''}
    lifecycle = _parse('lifecycle', configurations['lifecycle'], bool)
    files = LaunchParameters()      # not launch_ros's dicts: they stay in the temp folder
    namespace = configurations['namespace']
    common = dict(
        package=PACKAGE, name=PACKAGE, namespace=namespace, output='screen', emulate_tty=True,
        parameters=[config_file] + ([files.file(namespace, PACKAGE, overrides)] if overrides else []))
    node = (LifecycleNode(executable='vla_policy_lifecycle_node', **common) if lifecycle
            else Node(executable='vla_policy_node', **common))
    return [node, RegisterEventHandler(OnProcessExit(target_action=node, on_exit=_on_node_exit)),
            files.remove_at_shutdown()]


def generate_launch_description() -> LaunchDescription:
    """Declare the arguments; the node is made once they are known (overrides only if given)."""
    default_config = os.path.join(get_package_share_directory(PACKAGE), 'config', 'default.yaml')
    arguments = [
        DeclareLaunchArgument('config_file', default_value=default_config,
                              description='Parameter file of the node.'),
        DeclareLaunchArgument('namespace', default_value='',
                              description='Namespace of the node and its (relative) topics.'),
        DeclareLaunchArgument('lifecycle', default_value='false', choices=['true', 'false'],
                              description='true: a managed lifecycle node (configure loads the '
                              'policy, activate commands), driven by ros2 lifecycle set or a '
                              'lifecycle manager.'),
    ] + [DeclareLaunchArgument(name, default_value='', description=description)
         for name, (description, _) in OVERRIDES.items()]
    declared = tuple(argument.name for argument in arguments)
    return LaunchDescription(arguments + [OpaqueFunction(function=_node, args=[declared])])
