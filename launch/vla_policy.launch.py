"""
Start vla_policy_node with config/default.yaml (or another parameter file).

Launch arguments: config_file, namespace, device, use_sim_time. For example::

    ros2 launch vla_policy_node vla_policy.launch.py device:=cuda namespace:=arm
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue


def generate_launch_description() -> LaunchDescription:
    """Declare the arguments and the node; parameters from the file, then the overrides."""
    default_config = os.path.join(
        get_package_share_directory('vla_policy_node'), 'config', 'default.yaml')
    return LaunchDescription([
        DeclareLaunchArgument(
            'config_file', default_value=default_config,
            description='Parameter file of the node.'),
        DeclareLaunchArgument(
            'namespace', default_value='', description='Namespace of the node and its topics.'),
        DeclareLaunchArgument(
            'device', default_value='auto', description='Torch device: auto, cpu, cuda, cuda:N.'),
        DeclareLaunchArgument(
            'use_sim_time', default_value='false', description='Use the /clock topic.'),
        Node(
            package='vla_policy_node',
            executable='vla_policy_node',
            name='vla_policy_node',
            namespace=LaunchConfiguration('namespace'),
            output='screen',
            emulate_tty=True,
            parameters=[
                LaunchConfiguration('config_file'),
                {
                    'device': LaunchConfiguration('device'),
                    'use_sim_time': ParameterValue(
                        LaunchConfiguration('use_sim_time'), value_type=bool),
                },
            ],
        ),
    ])
