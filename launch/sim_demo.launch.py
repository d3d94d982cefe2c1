# SPDX-License-Identifier: Apache-2.0
"""
The demo in a colcon workspace: the node with the shipped policy and the simulated SO-101.

    ros2 launch vla_policy_node sim_demo.launch.py episodes:=20
    ros2 launch vla_policy_node sim_demo.launch.py lockstep:=false    # physics in real time

The node reads default.yaml, so101.yaml and demo.yaml, as ``make demo`` does; the robot keeps
time in lockstep with it (``/clock``, ``use_sim_time``) unless ``lockstep:=false``. The
checkpoint ships inside the Python package (vla_policy_node/sim/so101/touch_policy), so its
folder is taken from the installed module rather than from share/.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction, RegisterEventHandler, Shutdown
from launch.event_handlers import OnProcessExit
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from vla_policy_node.ros.launch_parameters import LaunchParameters
from vla_policy_node.sim.so101 import SHIPPED_CHECKPOINT


def _processes(context: LaunchContext) -> list:
    """Start the node (default.yaml, so101.yaml, demo.yaml, checkpoint) and the robot; the launch ends with either."""
    config = os.path.join(get_package_share_directory('vla_policy_node'), 'config')
    demo = os.path.join(config, 'demo.yaml')
    files = LaunchParameters()
    node = Node(
        package='vla_policy_node', executable='vla_policy_node', name='vla_policy_node',
        output='screen', emulate_tty=True,
        parameters=[os.path.join(config, 'default.yaml'), os.path.join(config, 'so101.yaml'), demo,
                    files.file('', 'vla_policy_node', {'checkpoint': str(SHIPPED_CHECKPOINT),
                                                       'use_sim_time': lockstep(context)})])
    episodes = int(LaunchConfiguration('episodes').perform(context))
    robot = Node(
        package='vla_policy_node', executable='vla_policy_sim_robot', name='vla_policy_sim_robot',
        output='screen', emulate_tty=True,
        parameters=[demo, files.file('', 'vla_policy_sim_robot',
                                     {'episodes': episodes, 'record_prefix': 'demo_episode',
                                      'lockstep': lockstep(context)})])
    return [
        node,
        robot,
        files.remove_at_shutdown(),
        RegisterEventHandler(OnProcessExit(target_action=robot, on_exit=[
            Shutdown(reason='the simulated robot finished its episodes')])),
        RegisterEventHandler(OnProcessExit(target_action=node, on_exit=[
            Shutdown(reason='the policy node exited')])),
    ]


def lockstep(context: LaunchContext) -> bool:
    """Return the ``lockstep`` argument: true or false, anything else is an error."""
    value = LaunchConfiguration('lockstep').perform(context).lower()
    if value not in ('true', 'false'):
        raise ValueError(f'lockstep:={value} is not true or false')
    return value == 'true'


def generate_launch_description() -> LaunchDescription:
    """
    Declare the episode count; start the node and the robot once it is known.

    The launch ends when either process exits, as ``make demo`` does: the robot after its
    episodes, the node if it cannot start.
    """
    return LaunchDescription([
        DeclareLaunchArgument('episodes', default_value='10', description='Episodes to run.'),
        DeclareLaunchArgument('lockstep', default_value='true',
                              description='true: the simulation keeps time with the node (/clock, use_sim_time); '
                                          'false: physics in real time.'),
        OpaqueFunction(function=_processes),
    ])
