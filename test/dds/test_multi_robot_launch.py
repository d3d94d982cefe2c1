# SPDX-License-Identifier: Apache-2.0
"""launch/multi_robot.launch.py: one server, N robots in their own namespaces (built, not run)."""

import importlib.util
from pathlib import Path
from unittest import mock

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
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


def given(node) -> tuple[list[str], dict]:
    """Return the parameter files the launch gives ``node`` and the values of the last, which is its own."""
    files = [''.join(str(getattr(p, 'text', p)) for p in entry.param_file) for entry in node._Node__parameters]
    document = yaml.safe_load(Path(files[-1]).read_text())
    (name, section), = document.items()

    def text(parts):
        return ''.join(str(getattr(p, 'text', p)) for p in parts or [])
    namespace = text(node._Node__node_namespace).strip('/')
    assert name == (f'/{namespace}/' if namespace else '/') + text(node._Node__node_name)
    return files[:-1], section['ros__parameters']


def test_one_server_and_a_remote_policy_node_and_sim_robot_per_namespace():
    """The values go in parameter files keyed by each node's full name, removed when the launch ends."""
    module, description = load()
    context = launch.LaunchContext()
    for entity in description.entities:
        if type(entity).__name__ == 'DeclareLaunchArgument':
            entity.visit(context)
    files = module.LaunchParameters()
    started = module.server(context, files)
    servers = [e for e in started if getattr(e, 'node_executable', None) == 'vla_policy_server']
    assert len(servers) == 1
    context.launch_configurations['robots'] = '3'
    nodes = [e for e in module.robots(context, files) if hasattr(e, 'node_executable')]
    assert [n.node_executable for n in nodes] == ['vla_policy_sim_robot', 'vla_policy_node'] * 3
    default, so101, demo = (str(ROOT / 'config' / name) for name in ('default.yaml', 'so101.yaml', 'demo.yaml'))
    for node in nodes[1::2]:
        before, values = given(node)
        assert before == [default, so101, demo]     # the SO-101's files, keyed /** and /**/vla_policy_node
        assert values == {'inference': 'remote', 'remote.server': '/vla_policy_server',
                          'chunking.horizon': module.shipped_chunk_size(), 'joint_states_topic': 'joint_states',
                          'use_sim_time': True}
    for index, arm in enumerate(nodes[0::2], start=1):
        before, values = given(arm)
        assert before == [demo] and values['policy_node'] == f'/robot{index}/vla_policy_node'
        assert values['lockstep'] is True       # the arm keeps time with its own node, on its own /clock
    for node in nodes:
        assert ('/clock', 'clock') in [tuple(''.join(str(getattr(p, 'text', p)) for p in part) for part in pair)
                                       for pair in node._Node__remappings]
    from vla_policy_node.sim.so101 import SHIPPED_CHECKPOINT
    _, server = given(servers[0])
    assert server['checkpoint'] == str(SHIPPED_CHECKPOINT) and server['batch.window'] == 0.0
    # so101.yaml then demo.yaml, merged: the server sees the simulation's one raw camera and the joint units.
    assert server['camera_names'] == ['front'] and server['camera_transports'] == ['raw']
    assert server['joint_units']['scale'][0] == 57.30977
    assert context.launch_configurations['horizon'] == str(module.shipped_chunk_size())
    from vla_policy_node.ament_registration import EXECUTABLES      # setup.py's console scripts
    assert EXECUTABLES['vla_policy_server'] == 'vla_policy_node.ros.entry:server_main'
    files.remove()                      # what the launch's shutdown does
    assert not Path(files.folder).exists()


def test_lockstep_false_runs_every_arm_in_real_time():
    module, description = load()
    context = launch.LaunchContext()
    for entity in description.entities:
        if type(entity).__name__ == 'DeclareLaunchArgument':
            entity.visit(context)
    context.launch_configurations['lockstep'] = 'false'
    files = module.LaunchParameters()
    arm, node = [e for e in module.robots(context, files) if hasattr(e, 'node_executable')][:2]
    assert given(arm)[1]['lockstep'] is False and given(node)[1]['use_sim_time'] is False
    context.launch_configurations['lockstep'] = 'maybe'
    with pytest.raises(ValueError, match='lockstep:=maybe'):
        module.robots(context, files)
    files.remove()


def test_servers_2_starts_a_second_server_in_every_robots_pool_each_on_its_own_gpu():
    module, description = load()
    context = launch.LaunchContext()
    for entity in description.entities:
        if type(entity).__name__ == 'DeclareLaunchArgument':
            entity.visit(context)
    context.launch_configurations.update({'servers': '2', 'device': 'cuda'})
    files = module.LaunchParameters()
    servers = [e for e in module.server(context, files) if getattr(e, 'node_executable', None)]
    assert [given(s)[1]['device'] for s in servers] == ['cuda:0', 'cuda:1']
    robots = [e for e in module.robots(context, files) if getattr(e, 'node_executable', None) == 'vla_policy_node']
    for robot in robots:
        values = given(robot)[1]
        assert (values['remote.server'], values['remote.servers']) == ('/vla_policy_server',
                                                                       ['/server2/vla_policy_server'])
    files.remove()


def test_launch_parameter_files_keep_strings_strings_and_go_at_shutdown():
    from vla_policy_node.ros.launch_parameters import LaunchParameters
    files = LaunchParameters()
    path = Path(files.file('arm', 'vla_policy_node', {'checkpoint': 'n', 'device': '1e5', 'flag': True,
                                                      'limits': {'lower': [0.5, -1.0]}}))
    text = path.read_text()
    assert ": 'n'" in text and ": '1e5'" in text          # rcl reads y, n, 1e5 unquoted as a bool, a double
    assert yaml.safe_load(text) == {'/arm/vla_policy_node': {'ros__parameters': {
        'checkpoint': 'n', 'device': '1e5', 'flag': True, 'limits': {'lower': [0.5, -1.0]}}}}
    files.remove()
    assert not path.parent.exists()


def test_the_server_settings_carry_everything_the_policy_loader_reads():
    import re

    from vla_policy_node.ros import policy_loader
    from vla_policy_node.ros.server.node import ServerSettings
    read = set(re.findall(r'settings\.(\w+)', Path(policy_loader.__file__).read_text()))
    assert read - set(ServerSettings.__dataclass_fields__) == set()


def test_the_tally_ends_the_launch_with_the_combined_success_rate_once_every_arm_gave_its_own():
    module, _ = load()
    tally = module.Tally(2)
    assert tally.on_output('robot1', 'episode   1/2: ... SUCCESS\n') == []
    assert tally.on_output('robot1', 'success rate: 2/2 = 100% (through vla_policy_node over DDS)\n') == []
    log, shutdown = tally.on_output('robot2', 'success rate: 1/2 = 50% (through vla_policy_node over DDS)\n')
    assert [part.text for part in log.msg] == ['combined success rate: 3/4 = 75% over 2 robots']
    assert type(shutdown).__name__ == 'Shutdown'
    failed = mock.Mock(returncode=1)
    assert tally.on_exit('robot1', mock.Mock(returncode=0)) == []
    assert type(tally.on_exit('robot2', failed)[-1]).__name__ == 'Shutdown'
