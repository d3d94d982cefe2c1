# SPDX-License-Identifier: Apache-2.0
"""
The policy families, by LeRobot's ``config.json`` ``type``: SmolVLA, and pi0 / pi0.5 on PaliGemma.

``FAMILIES`` is the one place that says what differs between them for the loader: which
backbone's checkpoint layout to read, the network class, how LeRobot's weight names map to
ours, and how the prompt carries the robot state. A new family is one entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from torch import nn

from vla_policy_node.model.families import pi0, pi05, smolvla


@dataclass(frozen=True)
class Family:
    """What the loader needs to know of one policy family."""

    name: str                                   # LeRobot's config.json "type"
    backbone: str                               # "smolvlm" or "paligemma": the checkpoint layout read
    network: type[nn.Module]                    # built from the backbone's config dataclass
    key_rules: Callable[[], list[tuple[str, Optional[str]]]]   # LeRobot/openpi names -> ours
    state_in_prompt: bool = False               # pi0.5: the state is prompt text, not a network input


SMOLVLA = Family("smolvla", "smolvlm", smolvla.SmolVLA, smolvla.key_rules)
PI0 = Family("pi0", "paligemma", pi0.Pi0, pi0.key_rules)
PI05 = Family("pi05", "paligemma", pi05.Pi05, pi05.key_rules, state_in_prompt=True)
FAMILIES: dict[str, Family] = {f.name: f for f in (SMOLVLA, PI0, PI05)}
