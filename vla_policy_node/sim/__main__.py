# SPDX-License-Identifier: Apache-2.0
"""``python -m vla_policy_node.sim checkpoint [so101|planar]``: print a shipped checkpoint's folder (default so101)."""

import sys

from vla_policy_node.sim import PLANAR_CHECKPOINT
from vla_policy_node.sim.so101 import SHIPPED_CHECKPOINT as SO101_CHECKPOINT

CHECKPOINTS = {"so101": SO101_CHECKPOINT, "planar": PLANAR_CHECKPOINT}


def main(argv: list[str]) -> int:
    """Print the folder, or say how to call this."""
    if not argv or argv[0] != "checkpoint" or len(argv) > 2 or (len(argv) == 2 and argv[1] not in CHECKPOINTS):
        print("usage: python -m vla_policy_node.sim checkpoint [so101|planar]", file=sys.stderr)
        return 2
    folder = CHECKPOINTS[argv[1] if len(argv) == 2 else "so101"]
    if not (folder / "config.json").is_file():
        print(f"the shipped checkpoint is missing at {folder}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
