# SPDX-License-Identifier: Apache-2.0
"""
Start vla_policy_node with config/default.yaml, or parameter files layered in order.

Launch arguments (``ros2 launch vla_policy_node vla_policy.launch.py --show-args``):
``config_file``, ``params_files``, ``namespace``, ``lifecycle``, ``autostart``, ``log_level``,
``record`` and the overrides ``checkpoint``, ``device``, ``use_sim_time``. The node reads
``config_file``, then each of ``params_files`` (comma-separated) in order: a later file's
value wins, as with repeated ``--params-file``. An override is passed to the node only when
it is given, so the files' values stand otherwise; an argument this file does not declare is
an error (a typo such as ``checkpont:=`` must not start the node without its checkpoint). The
launch shuts down when the node exits, and ``ros2 launch`` exits non-zero when the node failed.
Topics are relative and the shipped files are keyed by wildcards, so ``namespace:=arm`` makes
the node read ``/arm/joint_states`` with the files' values. For example
``ros2 launch vla_policy_node vla_policy.launch.py params_files:=so101.yaml,my_robot.yaml
checkpoint:=lerobot/smolvla_base device:=cuda namespace:=arm``. With ``lifecycle:=true
autostart:=true`` the launch configures the managed node, then activates it once configured;
``record:=true`` records the node's topics with ``vla-policy-record`` (``vla-policy-replay`` reads the bag);
the launch fails when the recorder does.

Included from another launch file, give it its own scope so that the parent's launch
configurations do not count as arguments of this file: ``GroupAction([IncludeLaunchDescription(
..., launch_arguments=...)], scoped=True, forwarding=False)``.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, EmitEvent, OpaqueFunction, RegisterEventHandler, Shutdown
from launch.event_handlers import OnProcessExit
from launch.events import matches_action
from launch.events.process import ProcessExited
from launch_ros.actions import LifecycleNode, Node
from launch_ros.event_handlers import OnStateTransition
from launch_ros.events.lifecycle import ChangeState
from lifecycle_msgs.msg import Transition

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
LOG_LEVELS = ['debug', 'info', 'warn', 'error', 'fatal']


def _parse(name: str, text: str, kind: type) -> object:
    if kind is bool:
        if text.lower() not in BOOLEANS:
            raise ValueError(f"launch argument {name}:={text} must be true or false")
        return BOOLEANS[text.lower()]
    return text


def _parameter_files(configurations: dict[str, str]) -> list[str]:
    """Return config_file then params_files, in order; a name without a folder is a shipped config file."""
    shipped = os.path.join(get_package_share_directory(PACKAGE), 'config')
    names = [configurations['config_file']] + [
        name.strip() for name in configurations['params_files'].split(',') if name.strip()]
    files = []
    for argument, name in zip(['config_file'] + ['params_files'] * (len(names) - 1), names):
        path = name if os.path.dirname(name) or os.path.isfile(name) else os.path.join(shipped, name)
        if not os.path.isfile(path):        # launch_ros would drop it with a warning
            raise ValueError(f'{argument} {name!r} is not a file')
        files.append(path)
    return files


def _on_node_exit(event: ProcessExited, context: LaunchContext) -> list:
    """Shut the launch down with the node; a failed node makes ``ros2 launch`` exit non-zero."""
    if context.is_shutdown:         # the launch is ending anyway (Ctrl-C): nothing to add
        return []
    if event.returncode != 0:
        raise RuntimeError(f'{event.action.name} exited with code {event.returncode}')
    return [Shutdown(reason=f'{event.action.name} exited')]


def _autostart(node: LifecycleNode) -> list:
    """Return the actions that configure the node at once and activate it when it is configured."""
    def change(transition: int) -> EmitEvent:
        return EmitEvent(event=ChangeState(lifecycle_node_matcher=matches_action(node), transition_id=transition))
    return [RegisterEventHandler(OnStateTransition(target_lifecycle_node=node, start_state='configuring',
                                                   goal_state='inactive',
                                                   entities=[change(Transition.TRANSITION_ACTIVATE)])),
            change(Transition.TRANSITION_CONFIGURE)]


def _node(context: LaunchContext, declared: tuple[str, ...]) -> list:
    configurations = context.launch_configurations
    unknown = sorted(set(configurations) - set(declared))
    if unknown:
        raise ValueError(
            f'unknown launch arguments {unknown}; this file takes {sorted(declared)} '
            '(ros2 launch vla_policy_node vla_policy.launch.py --show-args)')
    parameter_files = _parameter_files(configurations)
    overrides = {name: _parse(name, configurations[name], kind)
                 for name, (_, kind) in OVERRIDES.items() if configurations.get(name, '') != ''}
    lifecycle = _parse('lifecycle', configurations['lifecycle'], bool)
    autostart = _parse('autostart', configurations['autostart'], bool)
    if autostart and not lifecycle:
        raise ValueError('autostart:=true drives the lifecycle node: give lifecycle:=true too '
                         '(the plain node commands as soon as it is up)')
    files = LaunchParameters()      # not launch_ros's dicts: they stay in the temp folder
    namespace = configurations['namespace']
    common = dict(
        package=PACKAGE, name=PACKAGE, namespace=namespace, output='screen', emulate_tty=True,
        ros_arguments=['--log-level', configurations['log_level']],
        parameters=parameter_files + ([files.file(namespace, PACKAGE, overrides)] if overrides else []))
    node = (LifecycleNode(executable='vla_policy_lifecycle_node', **common) if lifecycle
            else Node(executable='vla_policy_node', **common))
    record = _parse('record', configurations['record'], bool)
    return [node, RegisterEventHandler(OnProcessExit(target_action=node, on_exit=_on_node_exit)),
            files.remove_at_shutdown()] + (_autostart(node) if autostart else []) + (
        _recorder(namespace, parameter_files) if record else [])


def _recorder(namespace: str, parameter_files: list[str]) -> list:
    """
    Return vla-policy-record for the node's topics, and the launch's end when it exits.

    It writes ``vla_policy_[<namespace>_]<time to the microsecond>`` in the working folder, a name no other
    recorder takes. A recorder that fails (at start, or a full disk) ends the launch, failed: the robot
    must not run unrecorded when a recording was asked for.
    """
    recorder = Node(package=PACKAGE, executable='vla-policy-record', name='vla_policy_recorder',
                    namespace=namespace, output='screen',
                    arguments=[part for path in parameter_files for part in ('--params-file', path)])
    return [recorder, RegisterEventHandler(OnProcessExit(target_action=recorder, on_exit=_on_node_exit))]


def generate_launch_description() -> LaunchDescription:
    """Declare the arguments; the node is made once they are known (overrides only if given)."""
    default_config = os.path.join(get_package_share_directory(PACKAGE), 'config', 'default.yaml')
    arguments = [
        DeclareLaunchArgument('config_file', default_value=default_config,
                              description='First parameter file of the node (a bare name: one of '
                              'share/vla_policy_node/config).'),
        DeclareLaunchArgument('params_files', default_value='',
                              description='More parameter files, comma-separated, read after config_file '
                              'in order: a later file\'s value wins (a bare name: a shipped one, e.g. so101.yaml).'),
        DeclareLaunchArgument('namespace', default_value='',
                              description='Namespace of the node and its (relative) topics.'),
        DeclareLaunchArgument('lifecycle', default_value='false', choices=['true', 'false'],
                              description='true: a managed lifecycle node (configure loads the '
                              'policy, activate commands), driven by ros2 lifecycle set or a '
                              'lifecycle manager.'),
        DeclareLaunchArgument('autostart', default_value='false', choices=['true', 'false'],
                              description='With lifecycle:=true: configure the node at start and '
                              'activate it once configured.'),
        DeclareLaunchArgument('log_level', default_value='info', choices=LOG_LEVELS,
                              description='Severity the node logs from.'),
        DeclareLaunchArgument('record', default_value='false', choices=['true', 'false'],
                              description='true: vla-policy-record writes the node\'s inputs, commands and '
                              '/diagnostics to a rosbag2 bag vla_policy_[<namespace>_]<time> in the working folder; '
                              'the launch fails if the recorder does.'),
    ] + [DeclareLaunchArgument(name, default_value='', description=description)
         for name, (description, _) in OVERRIDES.items()]
    declared = tuple(argument.name for argument in arguments)
    return LaunchDescription(arguments + [OpaqueFunction(function=_node, args=[declared])])
