# SPDX-License-Identifier: Apache-2.0
"""
One vla_policy_server and N simulated robots, each with its own vla_policy_node (inference remote).

Robot ``i`` lives in namespace ``/robot<i>``: its simulated arm (``vla_policy_sim_robot``) and
its policy node talk on relative topics there; every policy node sends its chunk requests to
the one server. Launch arguments: robots (N, default 2), config_file, device (the server's),
batch_window (seconds), horizon (actions per chunk used by the robots, at most the policy's
chunk size). For example::

    ros2 launch vla_policy_node multi_robot.launch.py robots:=4 device:=cuda

The simulated arm publishes ``/joint_states``; it is remapped into the robot's namespace.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue


TASKS = ('pick up the red cube and place it in the bowl', 'open the drawer',
         'stack the green block on the blue one', 'push the cup to the left')


def robots(context: LaunchContext) -> list[Node]:
    """Return a simulated arm and a remote-inference policy node per robot namespace."""
    count = int(LaunchConfiguration('robots').perform(context))
    config = LaunchConfiguration('config_file')
    horizon = ParameterValue(LaunchConfiguration('horizon'), value_type=int)
    nodes = []
    for index in range(1, count + 1):
        namespace = f'robot{index}'
        nodes.append(Node(package='vla_policy_node', executable='vla_policy_sim_robot',
                          name='vla_policy_sim_robot', namespace=namespace, output='screen',
                          parameters=[{'instruction': TASKS[(index - 1) % len(TASKS)],
                                       'duration': 0.0}],
                          remappings=[('/joint_states', 'joint_states')]))
        nodes.append(Node(
            package='vla_policy_node', executable='vla_policy_node', name='vla_policy_node',
            namespace=namespace, output='screen', emulate_tty=True,
            parameters=[config, {'inference': 'remote', 'remote.server': '/vla_policy_server',
                                 'chunking.horizon': horizon,
                                 'joint_states_topic': 'joint_states'}]))
    return nodes


def generate_launch_description() -> LaunchDescription:
    """Declare the arguments, the server and the robots."""
    default_config = os.path.join(
        get_package_share_directory('vla_policy_node'), 'config', 'default.yaml')
    return LaunchDescription([
        DeclareLaunchArgument('robots', default_value='2', description='Number of robots.'),
        DeclareLaunchArgument('config_file', default_value=default_config,
                              description="Parameter file of the server and the robots' policy nodes."),
        DeclareLaunchArgument('device', default_value='auto',
                              description="The server's torch device: auto, cpu, cuda, cuda:N."),
        DeclareLaunchArgument('batch_window', default_value='0.005',
                              description='Seconds a request waits for others to share its batch.'),
        DeclareLaunchArgument('horizon', default_value='16',
                              description='Actions each robot uses per chunk.'),
        Node(package='vla_policy_node', executable='vla_policy_server', name='vla_policy_server',
             output='screen', emulate_tty=True,
             parameters=[LaunchConfiguration('config_file'), {
                 'device': LaunchConfiguration('device'),
                 'batch.window': ParameterValue(LaunchConfiguration('batch_window'),
                                                value_type=float)}]),
        OpaqueFunction(function=robots),
    ])
