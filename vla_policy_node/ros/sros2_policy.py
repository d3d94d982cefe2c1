# SPDX-License-Identifier: Apache-2.0
"""
Write the SROS2 access-control policy of running nodes from their interface in the ROS graph.

``python -m vla_policy_node.ros.sros2_policy /arm1/vla_policy_node /vla_policy_server -o policy.xml``
queries the graph of the current ``ROS_DOMAIN_ID`` for each node's publishers, subscriptions,
service servers and clients and action servers and clients (the task action
``~/run_instruction``, ``task_success``, ``~/episode``, ``~/command_goals``, the command topics,
the control_msgs action clients, the fleet's request, answer and heartbeat topics, ...) and
writes one SROS2 policy (format 0.2.0, as ``ros2 security create_permission`` reads it) that
allows exactly those, each node in its own enclave. Start every node of the deployment with
the parameters it will run with first: what a node does not create is not allowed. The
command-topic watchers only read the graph: they need no permission of their own. Action
topics and services (``/_action/``) are covered by their action; nothing else is filtered.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import sys
import time
from xml.etree import ElementTree

import rclpy
from rclpy.action.graph import get_action_client_names_and_types_by_node, get_action_server_names_and_types_by_node
from rclpy.node import Node

POLICY_VERSION = '0.2.0'
# (kind of entity, permission, how the node's entities are listed)
ACCESS = (('topics', 'publish', 'publishers'), ('topics', 'subscribe', 'subscribers'),
          ('services', 'reply', 'services'), ('services', 'request', 'clients'),
          ('actions', 'execute', 'action_servers'), ('actions', 'call', 'action_clients'))


def node_interface(graph: Node, fully_qualified: str) -> dict[str, list[str]]:
    """Return the names a node uses, by how it uses them (publishers, subscribers, services, ...)."""
    namespace, _, name = fully_qualified.rpartition('/')
    namespace = namespace or '/'
    listed = {'publishers': graph.get_publisher_names_and_types_by_node(name, namespace),
              'subscribers': graph.get_subscriber_names_and_types_by_node(name, namespace),
              'services': graph.get_service_names_and_types_by_node(name, namespace),
              'clients': graph.get_client_names_and_types_by_node(name, namespace),
              'action_servers': get_action_server_names_and_types_by_node(graph, name, namespace),
              'action_clients': get_action_client_names_and_types_by_node(graph, name, namespace)}
    return {what: sorted(n for n, _ in names if what.startswith('action') or '/_action/' not in n)
            for what, names in listed.items()}


def settled_interfaces(graph: Node, nodes: Sequence[str], timeout: float, settle: float = 1.0) -> dict | None:
    """
    Return the nodes' interfaces once discovery has settled (unchanged for ``settle`` s); None if a node is missing.

    Endpoints are discovered after their node, one by one: a policy written at the first sight
    of the node would miss some.
    """
    end = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < end:
        present = {f"{ns.rstrip('/')}/{name}" for name, ns in graph.get_node_names_and_namespaces()}
        now = {node: node_interface(graph, node) for node in nodes if node in present}
        if now != last:
            last, since = now, time.monotonic()
        elif len(now) == len(nodes) and time.monotonic() - since >= settle:
            return now
        time.sleep(0.1)
    return last if last is not None and len(last) == len(nodes) else None


def policy_xml(interfaces: dict[str, dict[str, list[str]]]) -> str:
    """Return the SROS2 policy that allows each node (fully qualified name -> interface) exactly its interface."""
    policy = ElementTree.Element('policy', version=POLICY_VERSION)
    enclaves = ElementTree.SubElement(policy, 'enclaves')
    for node, interface in sorted(interfaces.items()):
        namespace, _, name = node.rpartition('/')
        enclave = ElementTree.SubElement(enclaves, 'enclave', path=node)
        profiles = ElementTree.SubElement(enclave, 'profiles')
        profile = ElementTree.SubElement(profiles, 'profile', ns=namespace or '/', node=name)
        for kind, permission, what in ACCESS:
            if interface[what]:
                group = ElementTree.SubElement(profile, kind, {permission: 'ALLOW'})
                for entity in interface[what]:
                    ElementTree.SubElement(group, kind[:-1]).text = entity
    ElementTree.indent(policy)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(policy, encoding='unicode') + '\n'


def main(argv: Sequence[str] | None = None) -> int:
    """Write the policy of the named running nodes; exit 1 when one is not in the graph."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('nodes', nargs='+', help='fully qualified node names, e.g. /arm1/vla_policy_node')
    parser.add_argument('-o', '--output', help='policy file to write (default: standard output)')
    parser.add_argument('--wait', type=float, default=10.0, help='seconds to wait for the nodes to be discovered')
    args = parser.parse_args(argv)
    rclpy.init(args=[])
    try:
        interfaces = settled_interfaces(rclpy.create_node('sros2_policy_writer'), args.nodes, args.wait)
    finally:
        rclpy.try_shutdown()
    if interfaces is None:
        print(f'not all of {args.nodes} are in the graph of this ROS_DOMAIN_ID', file=sys.stderr)
        return 1
    text = policy_xml(interfaces)
    if args.output:
        with open(args.output, 'w') as out:
            out.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
