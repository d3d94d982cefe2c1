# SPDX-License-Identifier: Apache-2.0
"""
Which LeRobot wrote a checkpoint, recognised from its files.

LeRobot records no version in what it saves, yet the same files mean other inputs from 0.5
on, when LeRobot moved to transformers 5:

============  =====================================  ======================================
family        LeRobot 0.4.x (transformers 4.5x)      LeRobot >= 0.5 (transformers 5)
============  =====================================  ======================================
SmolVLA       vision position ids ``[0, 0, 1, ...]``  ``[0, 1, 2, ...]`` (``smolvla.py``)
pi0, pi0.5    images padded with -1 in [0, 1]         padded with 0 (``paligemma.py``)
pi0.5         state padded to ``max_state_dim``,      only the robot's own state dims binned
              then binned into the prompt
============  =====================================  ======================================

Each marker below bounds the release that wrote the files; their intersection is the
generation. Where the files allow more than one, the oldest is taken: a checkpoint without
any newer marker may come from 0.4.x (the hub's ``smolvla_base`` was written then). A SmolVLA
saved by LeRobot 0.5.x (no ``pretrained_revision``, no processor or tokenizer change) looks
exactly like a 0.4.x one: only ``vla_policy_node.json`` (``{"lerobot_version": "0.5.1"}``)
can tell it. Markers that contradict each other, or the override, refuse the checkpoint.

- ``config.json`` with ``pretrained_revision``: >= 0.6; without it: < 0.6 (draccus writes
  every field, ``null`` included).
- pi0 / pi0.5 ``config.json`` with ``use_relative_actions``: >= 0.5; without it: < 0.5.
- ``policy_preprocessor.json`` with a ``delta_actions_processor`` step: 0.5.x (renamed
  ``relative_actions_processor`` in 0.6: >= 0.6); ``policy_postprocessor.json`` with
  ``absolute_actions_processor``: >= 0.5; a pi0 / pi0.5 pipeline without them: < 0.5.
- A ``tokenizer_config.json`` in the checkpoint with ``"tokenizer_class": "TokenizersBackend"``:
  written by transformers 5, so >= 0.5.
- A SmolVLM ``config.json`` in the checkpoint whose ``text_config`` has ``rope_parameters``:
  transformers 5, so >= 0.5.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from vla_policy_node.model.families import FAMILIES

Version = tuple[int, ...]
OLDEST: Version = (0, 4)
NEWEST: Version = (99,)                  # open upper bound
GENERATIONS: tuple[Version, ...] = ((0, 4), (0, 5), (0, 6))


@dataclass(frozen=True)
class Marker:
    """One piece of evidence: ``where`` says ``what``, so the writer is in [low, high)."""

    where: str
    what: str
    low: Version = OLDEST
    high: Version = NEWEST

    def __str__(self) -> str:
        return f"{self.where}: {self.what} ({release_range(self.low, self.high)})"


@dataclass(frozen=True)
class Generation:
    """The LeRobot release (generation) a checkpoint is read as, and why."""

    version: Version                    # (0, 4), (0, 5) or (0, 6): the oldest the evidence allows
    markers: tuple[Marker, ...]
    override: Optional[str] = None      # the version a user wrote, when one was given

    @property
    def transformers5(self) -> bool:
        """Tell whether the checkpoint's writer ran transformers 5, as LeRobot >= 0.5 does."""
        return self.version >= (0, 5)

    def describe(self) -> str:
        name = f"LeRobot {'.'.join(map(str, self.version[:2]))}.x"
        if self.override:
            return f"{name} (lerobot_version {self.override} given; files agree)"
        evidence = "; ".join(str(m) for m in self.markers) or "no marker of a newer LeRobot in the files"
        return f"{name} ({evidence})"


class GenerationError(ValueError):
    """The files disagree with each other or with the version a user gave."""


def release_range(low: Version, high: Version) -> str:
    if high == NEWEST:
        return f"LeRobot >= {_name(low)}"
    if low == OLDEST:
        return f"LeRobot < {_name(high)}"
    return f"LeRobot {_name(low)} .. < {_name(high)}"


def _name(version: Version) -> str:
    return ".".join(map(str, version))


def markers(config: dict, preprocessor_steps: Optional[list[dict]], postprocessor_steps: Optional[list[dict]],
            tokenizer_config: Optional[dict] = None, vlm_config: Optional[dict] = None,
            tokenizer_where: str = "tokenizer_config.json", vlm_where: str = "VLM config.json") -> list[Marker]:
    """Collect the evidence in a LeRobot checkpoint's parsed files (None: the file is not in the checkpoint)."""
    family = FAMILIES.get(config.get("type"))
    paligemma = family is not None and family.backbone == "paligemma"     # pi0, pi0.5
    found = []
    if "pretrained_revision" in config:
        found.append(Marker("config.json", "has pretrained_revision", low=(0, 6)))
    else:
        found.append(Marker("config.json", "has no pretrained_revision", high=(0, 6)))
    if paligemma:
        if "use_relative_actions" in config:
            found.append(Marker("config.json", "has use_relative_actions", low=(0, 5)))
        else:
            found.append(Marker("config.json", "has no use_relative_actions", high=(0, 5)))
    for where, steps, names in (
            ("policy_preprocessor.json", preprocessor_steps,
             {"delta_actions_processor": ((0, 5), (0, 6)), "relative_actions_processor": ((0, 6), NEWEST)}),
            ("policy_postprocessor.json", postprocessor_steps, {"absolute_actions_processor": ((0, 5), NEWEST)})):
        if steps is None:
            continue
        present = [n for n in names if any(s.get("registry_name") == n for s in steps)]
        for name in present:
            found.append(Marker(where, f"has a {name} step", *names[name]))
        if not present and paligemma:
            found.append(Marker(where, f"has no {' or '.join(names)} step", high=(0, 5)))
    if tokenizer_config is not None and tokenizer_config.get("tokenizer_class") == "TokenizersBackend":
        found.append(Marker(tokenizer_where, "tokenizer_class TokenizersBackend (transformers 5)", low=(0, 5)))
    text = (vlm_config or {}).get("text_config")
    if isinstance(text, dict) and "rope_parameters" in text:
        found.append(Marker(vlm_where, "text_config has rope_parameters (transformers 5)", low=(0, 5)))
    return found


def recognise(found: list[Marker], override: Optional[Version] = None, override_text: Optional[str] = None,
              folder: Path | str = "") -> Generation:
    """
    Intersect the markers' ranges; the override picks within them, and must lie inside.

    Raises GenerationError naming the files when the markers exclude each other or the override.
    """
    low = max((m.low for m in found), default=OLDEST)
    high = min((m.high for m in found), default=NEWEST)
    if low >= high:
        newer = [m for m in found if m.low == low]
        older = [m for m in found if m.high == high]
        raise GenerationError(
            f"{folder}: the checkpoint's files come from different LeRobot versions: "
            f"{'; '.join(map(str, newer))} but {'; '.join(map(str, older))}. Save the policy and its "
            "processors again with one LeRobot")
    if override is not None:
        if not low <= override[:2] < high:
            raise GenerationError(
                f"{folder}: lerobot_version {override_text} contradicts the checkpoint's files, which say "
                f"{release_range(low, high)}: {'; '.join(str(m) for m in found if m.low == low or m.high == high)}."
                " Remove the override or correct it")
        version = max(g for g in GENERATIONS if g <= max(override[:2], OLDEST))
        return Generation(version, tuple(found), override_text)
    version = max(g for g in GENERATIONS if g <= low)
    telling = tuple(m for m in found if m.low == low and low != OLDEST) or tuple(
        m for m in found if m.high == high and high != NEWEST)
    return Generation(version, telling)
