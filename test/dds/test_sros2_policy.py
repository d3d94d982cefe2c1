# SPDX-License-Identifier: Apache-2.0
"""
The SROS2 policy written from the running nodes' interface (ros/sros2_policy.py) names every entity of it.

A robot node (inference remote, in /arm1) and a policy server run as processes; the policy is
written from the graph by the module's command line, as a user would, and must allow each
node exactly the topics it publishes and subscribes, its services and clients and its actions
(the task action among them), and the fleet's topics on the right side: the robot publishes
requests and reads answers and heartbeats, the server the reverse.
"""

from __future__ import annotations

import subprocess
import sys
from xml.etree import ElementTree

import pytest
import rclpy
from ros_harness import DEFAULT_CONFIG, next_domain_id, NodeProcess, ros_env, SERVER_COMMAND

from vla_policy_node.ros.sros2_policy import settled_interfaces

pytestmark = pytest.mark.dds

ROBOT, SERVER = '/arm1/vla_policy_node', '/vla_policy_server'


def allowed(policy: ElementTree.Element, node: str, kind: str, permission: str) -> set[str]:
    enclave = next(e for e in policy.iter('enclave') if e.get('path') == node)
    return {item.text for group in enclave.iter(kind) if group.get(permission) == 'ALLOW'
            for item in group if item.tag == kind[:-1]}


def test_the_policy_names_every_topic_service_and_action_of_the_nodes(tmp_path):
    domain = next_domain_id()
    robot = NodeProcess([DEFAULT_CONFIG], domain, ('-r', '__ns:=/arm1', '-p', 'inference:=remote',
                                                   '-p', 'chunking.horizon:=8'))
    server = NodeProcess([DEFAULT_CONFIG], domain, ('-p', 'tiny_model.chunk_size:=16'), command=SERVER_COMMAND)
    context = rclpy.Context()
    try:
        assert robot.wait_for_output('ready:', 90.0), robot.output
        assert server.wait_for_output('ready:', 90.0), server.output
        out = tmp_path / 'policy.xml'
        written = subprocess.run([sys.executable, '-m', 'vla_policy_node.ros.sros2_policy', ROBOT, SERVER,
                                  '-o', str(out)], env=ros_env(domain), capture_output=True, text=True, timeout=60)
        assert written.returncode == 0, written.stderr
        policy = ElementTree.parse(out).getroot()
        assert policy.get('version') == '0.2.0'
        rclpy.init(context=context, domain_id=domain)
        interfaces = settled_interfaces(rclpy.create_node('graph_reader', context=context), (ROBOT, SERVER), 15.0)
        assert interfaces is not None
        for node, interface in interfaces.items():
            assert interface['publishers'] and interface['subscribers'], interface
            for kind, permission, what in (('topics', 'publish', 'publishers'), ('topics', 'subscribe', 'subscribers'),
                                           ('services', 'reply', 'services'), ('actions', 'execute', 'action_servers'),
                                           ('actions', 'call', 'action_clients')):
                assert allowed(policy, node, kind, permission) >= set(interface[what]), (node, what)
        robot_publishes = allowed(policy, ROBOT, 'topics', 'publish')
        robot_reads = allowed(policy, ROBOT, 'topics', 'subscribe')
        assert '/vla_policy_server/requests' in robot_publishes
        assert {'/vla_policy_server/chunks', '/vla_policy_server/heartbeat', '/arm1/joint_states'} <= robot_reads
        assert '/arm1/vla_policy_node/run_instruction' in allowed(policy, ROBOT, 'actions', 'execute')
        assert {'/vla_policy_server/chunks', '/vla_policy_server/heartbeat'} <= allowed(policy, SERVER, 'topics',
                                                                                        'publish')
        assert '/vla_policy_server/chunks' not in robot_publishes, 'a robot may not answer for the server'
        assert allowed(policy, SERVER, 'topics', 'subscribe') >= {'/vla_policy_server/requests'}
        assert not any('/_action/' in t for t in robot_publishes | robot_reads), 'action topics go with their action'
    finally:
        rclpy.try_shutdown(context=context)
        robot.kill()
        server.kill()
