# SPDX-License-Identifier: Apache-2.0
"""
LeRobot's saved processor pipelines, step by step: every step is implemented or refused by name.

``policy_preprocessor.json`` and ``policy_postprocessor.json`` list the steps LeRobot runs
around the network. A step this package does not know could change what the network sees or
what the robot gets, so an unknown step, or a known one configured in a way that is not
implemented, refuses the checkpoint at load with the file, the step and the reason.
What each known step becomes here:

====================================================  =================================================
step (``registry_name``)                              here
====================================================  =================================================
``rename_observations_processor``                     camera renames (``rename_map``); others refused
``to_batch_processor``, ``device_processor``          batching and the device are the node's own
``smolvla_new_line_processor``                        the prompt ends in a newline
``pi0_new_line_processor``                            the prompt ends in a newline
``tokenizer_processor``                               ``TextTokenizer`` with its length, padding, side
``normalizer_processor`` / ``unnormalizer_processor``  ``Normalizer`` (state, action; images IDENTITY)
``pi05_prepare_state_tokenizer_processor_step``       pi0.5's state-bin prompt
``relative_actions_processor`` (0.5: ``delta_...``) /  ``RelativeActions``: the raw state added back
``absolute_actions_processor``                        after un-normalizing
====================================================  =================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from vla_policy_node.model.relative_actions import RelativeActions, relative_mask

PRE = "policy_preprocessor.json"
POST = "policy_postprocessor.json"
NEWLINE_STEPS = ("smolvla_new_line_processor", "pi0_new_line_processor")
RELATIVE_STEPS = ("relative_actions_processor", "delta_actions_processor")   # 0.6 name, 0.5 name
STEPS = {
    PRE: ("rename_observations_processor", "to_batch_processor", "device_processor", "tokenizer_processor",
          "normalizer_processor", "pi05_prepare_state_tokenizer_processor_step") + NEWLINE_STEPS + RELATIVE_STEPS,
    POST: ("unnormalizer_processor", "absolute_actions_processor", "device_processor"),
}
FAMILY_STEPS = {   # steps only one family's network makes sense of
    "pi05_prepare_state_tokenizer_processor_step": ("pi05",),
    "relative_actions_processor": ("pi0", "pi05"),
    "delta_actions_processor": ("pi0", "pi05"),
    "absolute_actions_processor": ("pi0", "pi05"),
}
IMAGE_PREFIX = "observation.images."
STATE_FILE = re.compile(r"(?P<pipeline>.+)_step_(?P<index>\d+)(?:_(?P<step>.+))?\.safetensors")


class ProcessorError(ValueError):
    """A saved processor step that is not implemented here, or configured inconsistently."""


@dataclass(frozen=True)
class Pipelines:
    """What the saved pipelines ask of the pre- and post-processing, checked."""

    newline: bool                                   # a new-line step appends "\n" to the task
    camera_renames: dict[str, str]                  # given feature name -> the policy's feature name
    relative: Optional[RelativeActions]             # None: absolute actions
    state_tokenizer: bool                           # pi0.5's state-bin prompt step is there


def _steps(pipeline: Optional[list[dict]]) -> list[tuple[int, str, dict]]:
    out = []
    for index, entry in enumerate(pipeline or []):
        name = entry.get("registry_name")
        config = entry.get("config", {})
        out.append((index, name if isinstance(name, str) else repr(name), config if isinstance(config, dict) else {}))
    return out


def read_pipelines(family: str, config: dict, pre: Optional[list[dict]], post: Optional[list[dict]],
                   action_dim: int, state_dim: int) -> Pipelines:
    """
    Check every step of the two pipelines (None: the file is absent) and return what they ask.

    ``config`` is ``config.json``: its relative-action keys must agree with the steps.
    """
    for file, pipeline in ((PRE, pre), (POST, post)):
        for index, name, step_config in _steps(pipeline):
            where = f"{file} step {index} {name!r}"
            if name not in STEPS[file]:
                raise ProcessorError(
                    f"{where} is not implemented by vla_policy_node (it would change what the policy sees or "
                    f"commands); the steps it runs in {file} are {', '.join(STEPS[file])}")
            if family not in FAMILY_STEPS.get(name, (family,)):
                raise ProcessorError(f"{where} belongs to {'/'.join(FAMILY_STEPS[name])} policies, not {family}")
            _check_step(where, name, step_config)
            _check_state_file(file, index, name, pipeline[index].get("state_file"))
    pre_steps, post_steps = _steps(pre), _steps(post)
    names = [name for _, name, _ in pre_steps]
    renames = {}
    for _, name, step_config in pre_steps:
        if name == "rename_observations_processor":
            renames.update(_camera_renames(step_config))
    return Pipelines(
        newline=any(n in NEWLINE_STEPS for n in names),
        camera_renames=renames,
        relative=_relative(config, pre_steps, post_steps, action_dim, state_dim),
        state_tokenizer="pi05_prepare_state_tokenizer_processor_step" in names)


def _check_step(where: str, name: str, config: dict) -> None:
    if name == "tokenizer_processor" and config.get("task_key", "task") != "task":
        raise ProcessorError(f"{where}: task_key {config.get('task_key')!r} is not implemented (only 'task')")
    if name == "pi05_prepare_state_tokenizer_processor_step" and config.get("task_key", "task") != "task":
        raise ProcessorError(f"{where}: task_key {config.get('task_key')!r} is not implemented (only 'task')")
    if name in ("normalizer_processor", "unnormalizer_processor"):
        norm_map = config.get("norm_map", {})
        visual = norm_map.get("VISUAL", "IDENTITY") if isinstance(norm_map, dict) else "IDENTITY"
        features = config.get("features", {})
        has_images = isinstance(features, dict) and any(str(k).startswith(IMAGE_PREFIX) for k in features)
        if visual != "IDENTITY" and has_images:
            raise ProcessorError(f"{where}: normalizing images ({visual}) is not implemented; "
                                 "the policies here take images in [0, 1] (VISUAL: IDENTITY)")


def _check_state_file(file: str, index: int, name: str, state_file: object) -> None:
    """Check that a step's statistics file is numbered by its place in the pipeline it was saved from."""
    match = STATE_FILE.fullmatch(state_file) if isinstance(state_file, str) else None
    if match is None:
        return
    if int(match["index"]) != index or match["step"] not in (None, name):
        raise ProcessorError(
            f"{file} lists {name!r} as step {index} but its state file {state_file} was written for step "
            f"{match['index']} {match['step'] or ''}: the processor files come from different LeRobot versions "
            "or were edited; save the processors again with one LeRobot")


def _camera_renames(config: dict) -> dict[str, str]:
    rename_map = config.get("rename_map", {})
    if not isinstance(rename_map, dict):
        raise ProcessorError(f"{PRE} rename_observations_processor: rename_map must be an object")
    for source, target in rename_map.items():
        if not (isinstance(source, str) and isinstance(target, str)
                and source.startswith(IMAGE_PREFIX) and target.startswith(IMAGE_PREFIX)):
            raise ProcessorError(
                f"{PRE} rename_observations_processor: renaming {source!r} to {target!r} is not implemented "
                f"(only camera features, {IMAGE_PREFIX}*)")
    return dict(rename_map)


def _enabled(step_config: dict, where: str) -> bool:
    """Return a step's ``enabled`` flag, a JSON boolean (the string "false" would read as on)."""
    value = step_config.get("enabled", False)
    if not isinstance(value, bool):
        raise ProcessorError(f"{where}: enabled must be true or false (a JSON boolean), got "
                             f"{type(value).__name__} {value!r:.80}")
    return value


def _relative(config: dict, pre: list[tuple[int, str, dict]], post: list[tuple[int, str, dict]],
              action_dim: int, state_dim: int) -> Optional[RelativeActions]:
    """Read the relative-action steps, checked against each other and against ``config.json``."""
    rel = [(i, c) for i, n, c in pre if n in RELATIVE_STEPS]
    norm = [i for i, n, _ in pre if n == "normalizer_processor"]
    absolute = [(i, c) for i, n, c in post if n == "absolute_actions_processor"]
    unnorm = [i for i, n, _ in post if n == "unnormalizer_processor"]
    if len(rel) > 1 or len(absolute) > 1:
        raise ProcessorError(f"{PRE} / {POST}: more than one relative or absolute actions step")
    rel_on = bool(rel) and _enabled(rel[0][1], f"{PRE} relative_actions_processor")
    abs_on = bool(absolute) and _enabled(absolute[0][1], f"{POST} absolute_actions_processor")
    if rel_on != abs_on:
        raise ProcessorError(
            f"{PRE} relative_actions_processor is {'enabled' if rel_on else 'off or absent'} but {POST} "
            f"absolute_actions_processor is {'enabled' if abs_on else 'off or absent'}: the actions would be "
            "left relative or offset twice")
    in_config = config.get("use_relative_actions")
    if in_config is not None and bool(in_config) != rel_on:
        raise ProcessorError(f"config.json use_relative_actions is {in_config} but {PRE} relative_actions_processor "
                             f"is {'enabled' if rel_on else 'off or absent'}")
    if not rel_on:
        return None
    rel_index, rel_config = rel[0]
    if norm and rel_index > norm[0]:
        raise ProcessorError(f"{PRE}: relative_actions_processor after normalizer_processor (step {rel_index} > "
                             f"{norm[0]}) would cache the normalized state; not implemented")
    if unnorm and absolute[0][0] < unnorm[0]:
        raise ProcessorError(f"{POST}: absolute_actions_processor before unnormalizer_processor is not implemented")
    exclude = rel_config.get("exclude_joints", [])
    names = rel_config.get("action_names")
    if not (isinstance(exclude, list) and all(isinstance(x, str) for x in exclude)):
        raise ProcessorError(f"{PRE} relative_actions_processor: exclude_joints must be a list of strings")
    if names is not None and not (isinstance(names, list) and all(isinstance(x, str) for x in names)):
        raise ProcessorError(f"{PRE} relative_actions_processor: action_names must be null or a list of strings")
    for key, value in (("relative_exclude_joints", exclude), ("action_feature_names", names)):
        if key in config and config[key] != value:
            raise ProcessorError(f"config.json {key} {config[key]!r:.120} disagrees with {PRE} "
                                 f"relative_actions_processor {value!r:.120}")
    if state_dim < action_dim:
        raise ProcessorError(f"relative actions add the state to each of the {action_dim} action dims, but the "
                             f"state has only {state_dim} (LeRobot cannot run this checkpoint either)")
    return RelativeActions(relative_mask(action_dim, exclude, names))
