# SPDX-License-Identifier: Apache-2.0
"""
launch_testing: ``ros2 launch vla_policy_node vla_policy.launch.py`` with arguments, checked over DDS.

The launch runs as a user runs it (the ``ros2`` command, the package found through the ament
index) with ``namespace:=arm``, a config file of its own and ``checkpoint:=lerobot/tiny_test``,
a hub id resolved from a Hugging Face cache the test builds. A probe robot in ``/arm`` then
checks that the node is ``/arm/vla_policy_node``, that its parameters are the file's (the
file's ``device`` is not replaced by a launch default) plus the override, and that it commands
the robot once a volatile publisher gives the task. SIGINT at the end stops the node and
ros2 launch exits 0.
"""

from __future__ import annotations

import atexit
from pathlib import Path
import shutil
import tempfile
import unittest

from launch_setup import require_launch_tools

require_launch_tools()

from hf_cache import make_cache, REPO_ID  # noqa: E402
import launch  # noqa: E402
import launch.actions  # noqa: E402
import launch_testing  # noqa: E402
import launch_testing.actions  # noqa: E402
import launch_testing.asserts  # noqa: E402
from launch_setup import ament_env, ros2_command  # noqa: E402
from probe_robot import ProbeRobot, wait_until  # noqa: E402
import pytest  # noqa: E402
from ros_harness import DEFAULT_CONFIG, next_domain_id, ros_env  # noqa: E402
import yaml  # noqa: E402

from vla_policy_node.bench.checkpoints import save_random_checkpoint  # noqa: E402

pytestmark = pytest.mark.dds

NAMESPACE = '/arm'


def robot_config(folder: Path) -> tuple[Path, dict]:
    """default.yaml for the saved checkpoint's cameras, with values that differ from the defaults."""
    document = yaml.safe_load(DEFAULT_CONFIG.read_text())
    params = document['/**']['ros__parameters']
    params.update(camera_names=['cam0', 'cam1'], device='cpu', control_rate_hz=25.0)
    path = folder / 'my_robot.yaml'
    path.write_text(yaml.safe_dump(document))
    return path, params


@pytest.mark.launch_test
def generate_test_description():
    """Run ros2 launch on a domain of its own, with a hub-id checkpoint from a test cache."""
    work = Path(tempfile.mkdtemp(prefix='vla_launch_'))
    atexit.register(shutil.rmtree, work, ignore_errors=True)     # after launch_testing stopped the launch
    make_cache(work / 'hub', save_random_checkpoint(work / 'tiny', 'tiny', 2, seed=1))
    config, params = robot_config(work)
    domain_id = next_domain_id()
    env = {**ros_env(domain_id), **ament_env(work / 'prefix'), 'HF_HUB_CACHE': str(work / 'hub'),
           'RCUTILS_LOGGING_USE_STDOUT': '1'}      # every line on stdout, which the tests read
    ros2_launch = launch.actions.ExecuteProcess(
        cmd=[ros2_command(), 'launch', 'vla_policy_node', 'vla_policy.launch.py',
             f'namespace:={NAMESPACE}', f'config_file:={config}', f'checkpoint:={REPO_ID}'],
        env=env, output='screen', sigterm_timeout='15')
    description = launch.LaunchDescription([ros2_launch, launch_testing.actions.ReadyToTest()])
    return description, {'ros2_launch': ros2_launch, 'domain_id': domain_id, 'params': params}


class TestLaunchedNode(unittest.TestCase):
    """While the launch runs."""

    def test_node_in_namespace_with_file_parameters_and_overrides_commands_the_robot(
            self, proc_output, ros2_launch, domain_id, params):
        proc_output.assertWaitFor('ready:', process=ros2_launch, timeout=120, stream='stdout')
        robot = ProbeRobot(domain_id, NAMESPACE, params)
        try:
            self.assertTrue(wait_until(
                lambda: ('vla_policy_node', NAMESPACE) in
                robot.node.get_node_names_and_namespaces(), 10.0))
            values = robot.parameters(['checkpoint', 'device', 'control_rate_hz', 'camera_names',
                                       'use_sim_time', 'joint_states_topic'])
            self.assertEqual(values, {
                'checkpoint': REPO_ID, 'device': 'cpu', 'control_rate_hz': 25.0,
                'camera_names': ['cam0', 'cam1'], 'use_sim_time': False,
                'joint_states_topic': 'joint_states'})
            robot.instruct('pick up the red cube')
            self.assertTrue(wait_until(lambda: robot.command_count() >= 3, 30.0))
            self.assertEqual(list(robot.commands[-1][1].joint_names), params['joint_names'])
        finally:
            robot.close()


@launch_testing.post_shutdown_test()
class TestLaunchShutdown(unittest.TestCase):
    """After launch_testing's SIGINT."""

    def test_ros2_launch_and_the_node_exit_cleanly(self, proc_info, proc_output, ros2_launch):
        launch_testing.asserts.assertExitCodes(proc_info, process=ros2_launch)
        launch_testing.asserts.assertInStdout(proc_output, 'stopped', ros2_launch)
        launch_testing.asserts.assertInStdout(
            proc_output, '[vla_policy_node-1]: process has finished cleanly', ros2_launch)
