# SPDX-License-Identifier: Apache-2.0
"""
Run the real node's ``main`` with a scripted policy whose first step takes 3 s.

Used by the signal tests to stop the node during an inference and before its first chunk,
which the tiny model (a few ms per step) cannot be made to do. Everything but the policy is
the installed node's code: parameters, signal handlers, hold, shutdown order.
"""

import sys

from scripted_policy import ScriptedPolicy

from vla_policy_node.ros import node

if __name__ == '__main__':
    node.make_policy = lambda *_: ScriptedPolicy([('sleep', 3.0)])
    sys.exit(node.main())
