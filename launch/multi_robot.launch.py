# SPDX-License-Identifier: Apache-2.0
"""
vla_policy_server(s) and N simulated arms, each with its own vla_policy_node (inference remote).

Robot ``i`` lives in namespace ``/robot<i>``: its simulated arm (``vla_policy_sim_robot``) and
its policy node talk on relative topics there; every policy node sends its chunk requests to a
server, which serves the arm's shipped policy (as ``sim_demo.launch.py`` does for one robot) in
batches. Launch arguments: robot (``so101``, the SO-101 in MuJoCo with default.yaml, so101.yaml
and demo.yaml; ``planar``, the numpy test arm with planar.yaml), robots (N, default 2),
servers (default 1: ``/vla_policy_server``; server i > 1 is ``/server<i>/vla_policy_server``, every
robot has them all in its pool and the fleet splits across the live ones), device (the
servers'; ``cuda`` with several servers puts server i on ``cuda:<i-1>``), batch_window
(seconds), horizon (actions per chunk used by the robots, at most the policy's chunk size,
which is the default), episodes (per arm; 0: until Ctrl-C), lockstep (default true: each arm
keeps time with its own node on ``/robot<i>/clock``, the node's ``/clock`` remapped there;
false: physics in real time). For example::

    ros2 launch vla_policy_node multi_robot.launch.py robots:=4 device:=cuda episodes:=5

The files' sections are keyed ``/**`` or ``/**/<node name>``, so every namespace's nodes read them. The
simulated arm publishes ``/joint_states``; it is remapped into the robot's namespace. With
episodes, the launch ends once every arm has printed its success rate, after the combined one
(``combined success rate: 7/10 = 70% over 2 robots``). When the server exits (a checkpoint that
does not load) or an arm fails, the launch shuts down.
"""

import json
import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, LogInfo, OpaqueFunction, RegisterEventHandler, Shutdown
from launch.event_handlers import OnProcessExit, OnProcessIO
from launch.events.process import ProcessExited
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node
import yaml

from vla_policy_node.ros.launch_parameters import LaunchParameters
from vla_policy_node.ros.sim.robot import parse_success_rate, success_rate
from vla_policy_node.sim import PLANAR_CHECKPOINT
from vla_policy_node.sim.so101 import SHIPPED_CHECKPOINT as SO101_CHECKPOINT

# Per simulated robot: the policy nodes' parameter files in order (the last one is also the
# arm's), and the shipped policy the servers load.
SETUPS = {'so101': (('default.yaml', 'so101.yaml', 'demo.yaml'), SO101_CHECKPOINT),
          'planar': (('default.yaml', 'planar.yaml'), PLANAR_CHECKPOINT)}


def config_files(robot: str) -> list[str]:
    """Return the paths of the policy nodes' parameter files for ``robot``."""
    config = os.path.join(get_package_share_directory('vla_policy_node'), 'config')
    return [os.path.join(config, name) for name in SETUPS[robot][0]]


def shipped_chunk_size() -> int:
    """Return the chunk size of the shipped policies: the most actions a robot can use per chunk."""
    sizes = set()
    for _, checkpoint in SETUPS.values():
        with open(os.path.join(checkpoint, 'config.json')) as f:
            sizes.add(int(json.load(f)['chunk_size']))
    return min(sizes)


def merged(base: dict, more: dict) -> dict:
    """``more`` over ``base``, nested dictionaries merged key by key (as later parameter files are)."""
    out = dict(base)
    for key, value in more.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def policy_section(files: list[str]) -> dict:
    """Merge the policy node's parameters of ``files`` after the first, in order (what the servers need)."""
    params: dict = {}
    for path in files[1:]:
        with open(path) as f:
            sections = yaml.safe_load(f)
        for key in ('/**', '/**/vla_policy_node'):
            params = merged(params, sections.get(key, {}).get('ros__parameters', {}))
    return params


def robot_kind(context: LaunchContext) -> str:
    kind = LaunchConfiguration('robot').perform(context)
    if kind not in SETUPS:
        raise ValueError(f"robot:={kind} is not one of {', '.join(SETUPS)}")
    return kind


class Tally:
    """The arms' success rates as they print them; the launch ends with the last one."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.rates: dict[str, tuple[int, int]] = {}

    def on_output(self, namespace: str, text: str) -> list:
        """Keep the arm's success rate; return the combined one and a shutdown once every arm gave its own."""
        rate = parse_success_rate(text)
        if rate is None or namespace in self.rates:
            return []
        self.rates[namespace] = rate
        if len(self.rates) < self.count:
            return []
        wins, done = (sum(column) for column in zip(*self.rates.values()))
        return [LogInfo(msg=f'combined {success_rate(wins, done)} over {self.count} robots'),
                Shutdown(reason='every simulated arm finished its episodes')]

    def on_exit(self, namespace: str, event: ProcessExited) -> list:
        """Shut the launch down with an error when an arm fails."""
        if event.returncode == 0:
            return []
        return [LogInfo(msg=f'the simulated arm of {namespace} exited with code {event.returncode}'),
                Shutdown(reason=f'the simulated arm of {namespace} failed')]


def server_names(count: int) -> list[str]:
    """Return the fully qualified names of ``count`` servers: the default one first."""
    return ['/vla_policy_server'] + [f'/server{i}/vla_policy_server' for i in range(2, count + 1)]


def robots(context: LaunchContext, files: LaunchParameters) -> list:
    """Return a simulated arm and a remote-inference policy node per robot namespace."""
    count = int(LaunchConfiguration('robots').perform(context))
    episodes = int(LaunchConfiguration('episodes').perform(context))
    files_of_node = config_files(robot_kind(context))
    horizon = int(LaunchConfiguration('horizon').perform(context))
    tally = Tally(count)
    pool = server_names(int(LaunchConfiguration('servers').perform(context)))
    more = {'remote.servers': pool[1:]} if len(pool) > 1 else {}
    in_step = LaunchConfiguration('lockstep').perform(context).lower()
    if in_step not in ('true', 'false'):
        raise ValueError(f'lockstep:={in_step} is not true or false')
    in_step = in_step == 'true'
    # Each arm's clock in its namespace: the arm publishes it, its node (use_sim_time) reads it.
    clock = [('/clock', 'clock')]
    entities = []
    for index in range(1, count + 1):
        namespace = f'robot{index}'
        arm = Node(package='vla_policy_node', executable='vla_policy_sim_robot',
                   name='vla_policy_sim_robot', namespace=namespace, output='screen',
                   parameters=[files_of_node[-1], files.file(namespace, 'vla_policy_sim_robot', {
                       'policy_node': f'/{namespace}/vla_policy_node', 'episodes': episodes, 'seed': index,
                       'lockstep': in_step})],
                   remappings=[('/joint_states', 'joint_states'), *clock])
        entities.append(arm)
        if episodes > 0:
            entities += [
                RegisterEventHandler(OnProcessIO(target_action=arm, on_stdout=lambda event, name=namespace:
                                                 tally.on_output(name, event.text.decode(errors='replace')))),
                RegisterEventHandler(OnProcessExit(target_action=arm, on_exit=lambda event, _, name=namespace:
                                                   tally.on_exit(name, event)))]
        entities.append(Node(
            package='vla_policy_node', executable='vla_policy_node', name='vla_policy_node',
            namespace=namespace, output='screen', emulate_tty=True,
            parameters=[*files_of_node, files.file(namespace, 'vla_policy_node', {
                'inference': 'remote', 'remote.server': pool[0], **more,
                'chunking.horizon': horizon, 'joint_states_topic': 'joint_states', 'use_sim_time': in_step})],
            remappings=clock))
    return entities


def server(context: LaunchContext, files: LaunchParameters) -> list:
    """Return the policy servers; the launch shuts down when one exits."""
    kind = robot_kind(context)
    default, *_ = files_of_node = config_files(kind)
    node_params = policy_section(files_of_node)      # cameras, joints, units: for the server's node name
    device = LaunchConfiguration('device').perform(context)
    names = server_names(int(LaunchConfiguration('servers').perform(context)))
    entities = []
    for index, name in enumerate(names):
        namespace = name.rpartition('/')[0].strip('/')
        node = Node(package='vla_policy_node', executable='vla_policy_server', name='vla_policy_server',
                    namespace=namespace, output='screen', emulate_tty=True,
                    parameters=[default, files.file(namespace, 'vla_policy_server', {
                        **node_params, 'checkpoint': str(SETUPS[kind][1]),
                        'device': f'cuda:{index}' if device == 'cuda' and len(names) > 1 else device,
                        'batch.window': float(LaunchConfiguration('batch_window').perform(context))})])
        entities += [node, RegisterEventHandler(OnProcessExit(target_action=node, on_exit=[
            Shutdown(reason=f'the policy server {name} exited')]))]
    return entities


def generate_launch_description() -> LaunchDescription:
    """Declare the arguments, then start the server and the robots (their parameter files in one folder)."""
    files = LaunchParameters()
    return LaunchDescription([
        DeclareLaunchArgument('robot', default_value='so101',
                              description='The simulated arm: so101 (MuJoCo) or planar (the numpy test arm).'),
        DeclareLaunchArgument('robots', default_value='2', description='Number of robots.'),
        DeclareLaunchArgument('servers', default_value='1',
                              description='Number of policy servers sharing the robots (one per GPU).'),
        DeclareLaunchArgument('device', default_value='auto',
                              description="The servers' torch device: auto, cpu, cuda (several servers: "
                                          'cuda:0, cuda:1, ...), cuda:N.'),
        DeclareLaunchArgument('batch_window', default_value='0.0',
                              description='Seconds a request reaching an idle server waits for company; '
                                          '0: continuous batching.'),
        DeclareLaunchArgument('horizon', default_value=str(shipped_chunk_size()),
                              description="Actions each robot uses per chunk (at most the policy's chunk size)."),
        DeclareLaunchArgument('lockstep', default_value='true',
                              description='true: each arm keeps time with its node (/robot<i>/clock, use_sim_time); '
                                          'false: physics in real time.'),
        DeclareLaunchArgument('episodes', default_value='0',
                              description='Episodes per simulated arm, then the launch ends with the combined '
                              'success rate; 0: until Ctrl-C.'),
        OpaqueFunction(function=server, args=[files]),
        OpaqueFunction(function=robots, args=[files]),
        files.remove_at_shutdown(),
    ])
