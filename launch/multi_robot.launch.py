# SPDX-License-Identifier: Apache-2.0
"""
One vla_policy_server and N simulated arms, each with its own vla_policy_node (inference remote).

Robot ``i`` lives in namespace ``/robot<i>``: its simulated table-top arm
(``vla_policy_sim_robot``) and its policy node talk on relative topics there; every policy node
sends its chunk requests to the one server, which serves the shipped table-top policy (as
``sim_demo.launch.py`` does for one robot) in batches. Launch arguments: robots (N, default 2),
device (the server's), batch_window (seconds), horizon (actions per chunk used by the robots,
at most the policy's chunk size, which is the default), episodes (per arm; 0: until Ctrl-C). For example::

    ros2 launch vla_policy_node multi_robot.launch.py robots:=4 device:=cuda

demo.yaml's settings are keyed by node name, so they are read here and given to each node of
every namespace. The simulated arm publishes ``/joint_states``; it is remapped into the robot's
namespace. When the server exits (a checkpoint that does not load), the launch shuts down.
"""

import json
import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction, RegisterEventHandler, Shutdown
from launch.event_handlers import OnProcessExit
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node
import yaml

from vla_policy_node.ros.launch_parameters import LaunchParameters
from vla_policy_node.sim import SHIPPED_CHECKPOINT


def config_files() -> tuple[str, dict, dict]:
    """Return default.yaml's path and demo.yaml's parameters of the policy node and of the arm."""
    config = os.path.join(get_package_share_directory('vla_policy_node'), 'config')
    with open(os.path.join(config, 'demo.yaml')) as f:
        demo = yaml.safe_load(f)
    return (os.path.join(config, 'default.yaml'), demo['/vla_policy_node']['ros__parameters'],
            demo['/vla_policy_sim_robot']['ros__parameters'])


def shipped_chunk_size() -> int:
    """Return the chunk size of the shipped policy: the most actions a robot can use per chunk."""
    with open(os.path.join(SHIPPED_CHECKPOINT, 'config.json')) as f:
        return int(json.load(f)['chunk_size'])


def robots(context: LaunchContext, files: LaunchParameters) -> list:
    """Return a simulated arm and a remote-inference policy node per robot namespace."""
    count = int(LaunchConfiguration('robots').perform(context))
    episodes = int(LaunchConfiguration('episodes').perform(context))
    default, node_params, arm_params = config_files()
    horizon = int(LaunchConfiguration('horizon').perform(context))
    nodes = []
    for index in range(1, count + 1):
        namespace = f'robot{index}'
        nodes.append(Node(package='vla_policy_node', executable='vla_policy_sim_robot',
                          name='vla_policy_sim_robot', namespace=namespace, output='screen',
                          parameters=[files.file(namespace, 'vla_policy_sim_robot', {
                              **arm_params, 'policy_node': f'/{namespace}/vla_policy_node',
                              'episodes': episodes, 'seed': index})],
                          remappings=[('/joint_states', 'joint_states')]))
        nodes.append(Node(
            package='vla_policy_node', executable='vla_policy_node', name='vla_policy_node',
            namespace=namespace, output='screen', emulate_tty=True,
            parameters=[default, files.file(namespace, 'vla_policy_node', {
                **node_params, 'inference': 'remote', 'remote.server': '/vla_policy_server',
                'chunking.horizon': horizon, 'joint_states_topic': 'joint_states'})]))
    return nodes


def server(context: LaunchContext, files: LaunchParameters) -> list:
    """Return the policy server, which shuts the launch down when it exits."""
    default, node_params, _ = config_files()
    node = Node(package='vla_policy_node', executable='vla_policy_server', name='vla_policy_server',
                output='screen', emulate_tty=True,
                parameters=[default, files.file('', 'vla_policy_server', {
                    **node_params, 'checkpoint': str(SHIPPED_CHECKPOINT),
                    'device': LaunchConfiguration('device').perform(context),
                    'batch.window': float(LaunchConfiguration('batch_window').perform(context))})])
    return [node, RegisterEventHandler(OnProcessExit(target_action=node, on_exit=[
        Shutdown(reason='the policy server exited')]))]


def generate_launch_description() -> LaunchDescription:
    """Declare the arguments, then start the server and the robots (their parameter files in one folder)."""
    files = LaunchParameters()
    return LaunchDescription([
        DeclareLaunchArgument('robots', default_value='2', description='Number of robots.'),
        DeclareLaunchArgument('device', default_value='auto',
                              description="The server's torch device: auto, cpu, cuda, cuda:N."),
        DeclareLaunchArgument('batch_window', default_value='0.0',
                              description='Seconds a request reaching an idle server waits for company; '
                                          '0: continuous batching.'),
        DeclareLaunchArgument('horizon', default_value=str(shipped_chunk_size()),
                              description="Actions each robot uses per chunk (at most the policy's chunk size)."),
        DeclareLaunchArgument('episodes', default_value='0',
                              description='Episodes per simulated arm; 0: until Ctrl-C.'),
        OpaqueFunction(function=server, args=[files]),
        OpaqueFunction(function=robots, args=[files]),
        files.remove_at_shutdown(),
    ])
