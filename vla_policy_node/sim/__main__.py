# SPDX-License-Identifier: Apache-2.0
"""``python -m vla_policy_node.sim checkpoint``: print the shipped checkpoint's folder."""

import sys

from vla_policy_node.sim import SHIPPED_CHECKPOINT


def main(argv: list[str]) -> int:
    """Print the folder, or say how to call this."""
    if argv != ["checkpoint"]:
        print("usage: python -m vla_policy_node.sim checkpoint", file=sys.stderr)
        return 2
    if not (SHIPPED_CHECKPOINT / "config.json").is_file():
        print(f"the shipped checkpoint is missing at {SHIPPED_CHECKPOINT}", file=sys.stderr)
        return 1
    print(SHIPPED_CHECKPOINT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
