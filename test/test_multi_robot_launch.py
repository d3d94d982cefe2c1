# SPDX-License-Identifier: Apache-2.0
"""launch/multi_robot.launch.py: one server, N robots in their own namespaces (built, not run)."""

import importlib.util
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[1]
launch = pytest.importorskip('launch')
pytest.importorskip('launch_ros')


def load():
    spec = importlib.util.spec_from_file_location('multi_robot_launch',
                                                  ROOT / 'launch' / 'multi_robot.launch.py')
    module = importlib.util.module_from_spec(spec)
    with mock.patch('ament_index_python.packages.get_package_share_directory',
                    return_value=str(ROOT)):
        spec.loader.exec_module(module)
        return module, module.generate_launch_description()


def performed(context, node) -> dict:
    """Return the parameters the launch gives ``node`` on top of its files, as the node gets them."""
    from launch_ros.utilities import evaluate_parameters
    return evaluate_parameters(context, node._Node__parameters)[-1]


def test_one_server_and_a_remote_policy_node_and_sim_robot_per_namespace():
    module, description = load()
    context = launch.LaunchContext()
    for entity in description.entities:
        if type(entity).__name__ == 'DeclareLaunchArgument':
            entity.visit(context)
    servers = [e for e in description.entities if getattr(e, 'node_executable', None)
               == 'vla_policy_server']
    assert len(servers) == 1
    context.launch_configurations['robots'] = '3'
    nodes = module.robots(context)
    assert [n.node_executable for n in nodes] == ['vla_policy_sim_robot', 'vla_policy_node'] * 3
    policy_nodes = nodes[1::2]
    for node in policy_nodes:
        overrides = node._Node__parameters[-1]
        keys = {''.join(str(getattr(p, 'text', p)) for p in key) for key in overrides}
        assert {'inference', 'remote.server', 'chunking.horizon', 'joint_states_topic'} <= keys
        demo = node._Node__parameters[1]          # demo.yaml's node settings: the arm's camera and joints
        assert {''.join(str(getattr(p, 'text', p)) for p in key) for key in demo} >= {'camera_names', 'joint_names'}
    for index, arm in enumerate(nodes[0::2], start=1):
        assert performed(context, arm)['policy_node'] == f'/robot{index}/vla_policy_node'
    from vla_policy_node.sim import SHIPPED_CHECKPOINT
    assert performed(context, servers[0])['checkpoint'] == str(SHIPPED_CHECKPOINT)
    assert context.launch_configurations['horizon'] == str(module.shipped_chunk_size())
    from vla_policy_node.ament_registration import EXECUTABLES      # setup.py's console scripts
    assert EXECUTABLES['vla_policy_server'] == 'vla_policy_node.ros.entry:server_main'


def test_the_server_settings_carry_everything_the_policy_loader_reads():
    import re

    from vla_policy_node.ros import policy_loader
    from vla_policy_node.ros.policy_server import ServerSettings
    read = set(re.findall(r'settings\.(\w+)', Path(policy_loader.__file__).read_text()))
    assert read - set(ServerSettings.__dataclass_fields__) == set()
