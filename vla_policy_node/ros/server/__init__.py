# SPDX-License-Identifier: Apache-2.0
"""The policy server node, the remote-inference client and their wire format."""
