# SPDX-License-Identifier: Apache-2.0
"""
Reading a checkpoint folder safely: JSON configs, safetensors weights, normalization statistics.

A checkpoint is untrusted input. Only safetensors and JSON are ever read: a
pickle-based file (``.bin``, ``.pt``, ``.ckpt``, ``.pkl``) is refused with the
reason, because unpickling runs arbitrary code. Every path a checkpoint names
(the config's backbone and tokenizer, a processor's ``state_file``) is resolved,
symlinks included, and must stay inside the checkpoint folder, and the folder
inside the allowed roots. A Hugging Face cache snapshot (``models--org--name/
snapshots/<rev>/``, whose files are links into the repository's ``blobs/``) may link
into that repository's own ``blobs/`` and nowhere else; a hub id (``org/name``) that is
not a folder resolves offline to its snapshot in the local cache. A safetensors header is parsed and checked here
(dtypes, shapes, offsets, file length) before a single tensor is read, so a
header that lies about sizes is an error, not an allocation.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import struct
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
from safetensors.numpy import load_file

from vla_policy_node.model.normalization import Normalizer
from vla_policy_node.model.tokenizer import hf_cache_dirs, resolve_tokenizer

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
SETTINGS_FILE = "vla_policy_node.json"   # what the checkpoint's own files do not say, written by the user
MAX_JSON_BYTES = 16 * 2**20
MAX_HEADER_BYTES = 100 * 2**20       # the limit the safetensors library itself enforces
MAX_STATS_BYTES = 16 * 2**20         # normalization statistics are a few vectors
FLOAT_DTYPES = ("F32", "F16", "BF16")
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
               "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded, with the reason."""


HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def checkpoint_dir(path: str | Path, allowed_roots: Sequence[str | Path] = ()) -> Path:
    """
    Resolve the folder (or a hub id's cached snapshot) and check it lies under ``allowed_roots``.

    A name that is not an existing folder but looks like a hub id (``lerobot/smolvla_base``)
    is looked up in the local Hugging Face cache, offline (:func:`hub_snapshot`).
    """
    folder = Path(path).expanduser()
    if not folder.exists() and HUB_ID.fullmatch(str(path)):
        folder = hub_snapshot(str(path))
    folder = training_folder(folder.resolve())
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {folder} does not exist")
    roots = [Path(r).expanduser().resolve() for r in allowed_roots]
    if roots and not any(folder == r or r in folder.parents for r in roots):
        raise CheckpointError(f"checkpoint folder {folder} is outside the allowed roots {[str(r) for r in roots]}")
    return folder


def training_folder(folder: Path) -> Path:
    """
    Return the policy folder of a LeRobot training folder, else ``folder``.

    ``lerobot-train`` saves ``<run>/checkpoints/<step>/pretrained_model/`` (``last`` links the newest
    step) and prints the step folder: that folder, ``checkpoints/``, and the run folder resolve to
    the ``pretrained_model/`` inside, with a log line saying so.
    """
    if (folder / "config.json").is_file():
        return folder
    for inner in ("pretrained_model", "last/pretrained_model", "checkpoints/last/pretrained_model"):
        candidate = folder / inner
        if (candidate / "config.json").is_file():
            resolved = candidate.resolve()
            log.info("%s is a LeRobot training folder: loading the policy it saved, %s", folder, resolved)
            return resolved
    return folder


def hub_snapshot(repo_id: str) -> Path:
    """
    Return the cached snapshot of hub model ``repo_id``, offline: the one ``refs/main`` names, else the only one.

    The cache is ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``
    (``huggingface_hub``'s rules). Nothing is downloaded: a miss says how to fetch it.
    """
    tried = []
    for cache in hf_cache_dirs():
        repo = cache / f"models--{repo_id.replace('/', '--')}"
        tried.append(str(repo))
        snapshots = repo / "snapshots"
        ref = repo / "refs" / "main"
        if ref.is_file():
            revision = ref.read_text(encoding="utf-8").strip()
            if re.fullmatch(r"[0-9a-f]{40}", revision) and (snapshots / revision).is_dir():
                return snapshots / revision
        found = sorted(p for p in snapshots.iterdir() if p.is_dir()) if snapshots.is_dir() else []
        if len(found) == 1:
            return found[0]
        if found:
            raise CheckpointError(
                f"{repo} holds {len(found)} snapshots and no refs/main: give the snapshot folder "
                f"itself ({', '.join(p.name for p in found)})")
    raise CheckpointError(
        f"checkpoint {repo_id!r} is neither a folder nor a model in the local Hugging Face cache "
        f"(looked in {', '.join(tried)}); download it first: hf download {repo_id}")


def cache_blobs(folder: Path) -> Optional[Path]:
    """
    ``<repo>/blobs`` when ``folder`` is a Hugging Face cache snapshot (``models--*/snapshots/<rev>``), else None.

    Only a real folder of the repository: a ``blobs`` (or ``snapshots``) that is itself a link
    could lead anywhere, so the snapshot's links are then followed nowhere outside ``folder``.
    """
    repo = folder.parent.parent
    if folder.parent.name != "snapshots" or not repo.name.startswith("models--"):
        return None
    blobs = repo / "blobs"
    if blobs.is_symlink() or folder.parent.is_symlink() or not blobs.is_dir() or blobs.resolve() != blobs:
        return None
    return blobs


def inside(folder: Path, name: str) -> Path:
    """
    ``folder / name`` resolved (symlinks too); refuses absolute names and anything that escapes ``folder``.

    In a Hugging Face cache snapshot a file may be a link into that repository's ``blobs/``:
    then the unresolved path is returned (its name and folder still mean something).
    """
    if not isinstance(name, str) or not name or "\0" in name:
        raise CheckpointError(f"invalid file name {name!r} in the checkpoint {folder}")
    if Path(name).is_absolute():
        raise CheckpointError(f"{name!r} is an absolute path; a checkpoint may only name files inside {folder}")
    path = (folder / name).resolve()
    if path == folder or folder in path.parents:
        return path
    blobs = cache_blobs(folder)
    if blobs is not None and path.parent == blobs and ".." not in Path(name).parts:
        return folder / name
    raise CheckpointError(f"{name!r} resolves to {path}, outside the checkpoint folder {folder}")


TINY_SIZES = "tiny_dims.json"


def tiny_sizes(folder: Path) -> Optional[dict]:
    """
    Return the test sizes of a tiny pi0 / pi0.5 checkpoint, or None for a real one.

    Why the probe stays: LeRobot's pi config names its sizes (``gemma_2b``, ``gemma_300m``)
    and cannot give others, so the tiny test checkpoints (the LeRobot and openpi fixtures,
    the read-only references, the bench's) name the published variants in ``config.json`` and
    carry their real sizes in ``tiny_dims.json`` beside it (the references cannot change).
    Only the pi loader probes; a stray file cannot shrink a real model unnoticed: the weights'
    names and shapes are checked against the sized model before anything is allocated, and a
    load sized here says so in the log.
    """
    path = inside(folder, TINY_SIZES)
    return read_json(path) if path.is_file() else None


def read_json(path: Path) -> dict:
    """Read a JSON object from a file of at most ``MAX_JSON_BYTES``."""
    if not path.is_file():
        raise CheckpointError(f"missing {path.name} in {path.parent}")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise CheckpointError(f"{path} is larger than {MAX_JSON_BYTES} bytes")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def config_value(config: dict, key: str, kind: type | tuple[type, ...], default: Any, source: str) -> Any:
    """``config[key]`` (or ``default``) if it has the JSON type ``kind``; a bool is never a number."""
    value = config.get(key, default)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise CheckpointError(f"{source}: {key} must be {names}, got {type(value).__name__} {value!r:.80}")
    return value


# Boolean fields of LeRobot's SmolVLA, pi0 and pi0.5 configs (0.4-0.6). draccus refuses a string there
# when LeRobot loads the config; read with Python's truth, "false" would be on.
LEROBOT_BOOL_FIELDS = ("adapt_to_pi_aloha", "add_image_special_tokens", "compile_model", "freeze_vision_encoder",
                       "gradient_checkpointing", "load_vlm_weights", "push_to_hub", "train_expert_only",
                       "train_state_proj", "use_amp", "use_cache", "use_delta_joint_actions_aloha", "use_peft",
                       "use_relative_actions")


def check_bool_fields(config: dict, fields: typing.Iterable[str], source: str) -> None:
    """Refuse, by name, a boolean field given as anything but a JSON boolean (``"false"`` is a string)."""
    for key in fields:
        if key in config and not isinstance(config[key], bool):
            raise CheckpointError(f"{source}: {key} must be true or false (a JSON boolean), got "
                                  f"{type(config[key]).__name__} {config[key]!r:.80}; LeRobot refuses it too")


def check_config_types(config: object, source: str) -> None:
    """
    Check a family config dataclass (recursively) against its annotations.

    ``from_lerobot``-style constructors copy JSON values without converting them, so a
    string where an int belongs would otherwise surface as a TypeError mid-inference.
    """
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value, hint = getattr(config, field.name), hints[field.name]
        where = f"{source}: {type(config).__name__}.{field.name}"
        if dataclasses.is_dataclass(value):
            check_config_types(value, source)
        elif hint is int and (not isinstance(value, int) or isinstance(value, bool)):
            raise CheckpointError(f"{where} must be an integer, got {type(value).__name__} {value!r:.80}")
        elif hint is float and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                or not math.isfinite(value)):
            raise CheckpointError(f"{where} must be a finite number, got {type(value).__name__} {value!r:.80}")
        elif hint is bool and not isinstance(value, bool):
            raise CheckpointError(f"{where} must be true or false, got {type(value).__name__} {value!r:.80}")
        elif hint is str and not isinstance(value, str):
            raise CheckpointError(f"{where} must be a string, got {type(value).__name__} {value!r:.80}")
        elif typing.get_origin(hint) is tuple and not isinstance(value, tuple):
            raise CheckpointError(f"{where} must be a list, got {type(value).__name__} {value!r:.80}")
        if isinstance(value, int) and not isinstance(value, bool) and value > 2**31:
            raise CheckpointError(f"{where} = {value} is implausibly large")


def parse_version(value: str, source: str) -> tuple[int, ...]:
    """'0.5', '0.4.4' or '0.5.1.dev0' -> (0, 5), (0, 4, 4), (0, 5, 1)."""
    match = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?([.+-]?[A-Za-z0-9.+-]*)", value.strip())
    if not match:
        raise CheckpointError(f"{source} must be a version such as 0.5 or 0.4.4, got {value!r:.80}")
    return tuple(int(g) for g in match.groups()[:3] if g is not None)


def lerobot_version(folder: Path) -> Optional[tuple[int, ...]]:
    """
    Return the LeRobot version that wrote the checkpoint, from ``vla_policy_node.json`` (None if absent).

    LeRobot's own files record no version (``config.json`` is a draccus dump of the policy
    config, the processor files list their steps), yet pi0 / pi0.5 preprocessing changed in
    0.5; so the user says it once, beside the checkpoint: ``{"lerobot_version": "0.5.1"}``.
    """
    path = inside(folder, SETTINGS_FILE)
    if not path.is_file():
        return None
    value = config_value(read_json(path), "lerobot_version", str, "", SETTINGS_FILE)
    return parse_version(value, f"{SETTINGS_FILE}: lerobot_version") if value else None


# ------------------------------------------------------------------ safetensors
@dataclass(frozen=True)
class TensorInfo:
    """One entry of a safetensors header, already checked against the file."""

    dtype: str                 # safetensors name: F32, BF16, I64, ...
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        """Return the number of elements."""
        return math.prod(self.shape)


def read_safetensors_header(path: Path, max_header_bytes: int = MAX_HEADER_BYTES) -> dict[str, TensorInfo]:
    """
    Parse and check a safetensors header without reading any tensor.

    Checks that the header fits the file, every dtype is known, every shape is a
    list of non-negative integers, each tensor's byte range matches its shape and
    dtype, the ranges tile the data section exactly (no overlap, no gap) and the
    data section ends where the file ends (a truncated or padded file is refused).
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{path.name} is {size} bytes: too short to be a safetensors file")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > min(max_header_bytes, size - 8):
                raise CheckpointError(
                    f"{path.name}: header claims {header_len} bytes but the file has {size - 8} after the length "
                    f"(limit {max_header_bytes}); the file is truncated or not safetensors")
            raw = f.read(header_len)
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{path.name}: safetensors header is not valid JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{path.name}: safetensors header must be a JSON object")
    header.pop("__metadata__", None)
    data_len = size - 8 - header_len
    tensors: dict[str, TensorInfo] = {}
    ranges: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        info, begin, end = _tensor_entry(path.name, name, entry)
        if end - begin != info.numel * DTYPE_BYTES[info.dtype]:
            raise CheckpointError(
                f"{path.name}: tensor {name} is {info.dtype} {list(info.shape)} = "
                f"{info.numel * DTYPE_BYTES[info.dtype]} bytes, but its data_offsets span {end - begin} bytes")
        tensors[name] = info
        ranges.append((begin, end, name))
    ranges.sort()
    pos = 0
    for begin, end, name in ranges:
        if begin != pos:
            raise CheckpointError(f"{path.name}: tensor {name} starts at data byte {begin}, expected {pos} "
                                  "(tensors overlap or leave a gap)")
        pos = end
    if pos != data_len:
        state = "truncated" if pos > data_len else "longer than its header says"
        raise CheckpointError(f"{path.name} is {state}: the header describes {pos} bytes of tensor data, "
                              f"the file holds {data_len}")
    return tensors


def _tensor_entry(file: str, name: str, entry: object) -> tuple[TensorInfo, int, int]:
    if not isinstance(entry, dict):
        raise CheckpointError(f"{file}: header entry {name!r} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise CheckpointError(f"{file}: tensor {name} has unknown dtype {dtype!r}")

    def is_count(x: object) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**62

    if not isinstance(shape, list) or len(shape) > 8 or not all(is_count(d) for d in shape):
        raise CheckpointError(f"{file}: tensor {name} has an invalid shape {shape!r:.80}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(is_count(o) for o in offsets) \
            or offsets[0] > offsets[1]:
        raise CheckpointError(f"{file}: tensor {name} has invalid data_offsets {offsets!r:.80}")
    return TensorInfo(dtype, tuple(shape)), offsets[0], offsets[1]


def weights_file(folder: Path) -> Path:
    """``model.safetensors``; a pickle-only checkpoint is refused, saying why."""
    path = inside(folder, "model.safetensors")
    if path.is_file():
        return path
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(
            f"{folder} holds only pickle-based weights {pickles}; they are refused because loading a pickle "
            "can run arbitrary code. Convert them to model.safetensors with the training framework.")
    raise CheckpointError(f"missing model.safetensors in {folder}")


def tokenizer_file(folder: Path, name: str) -> Path:
    """
    Find the ``tokenizer.json`` a config names: inside the checkpoint folder, else the local HF cache.

    The name may be a file or folder inside the checkpoint or a hub id found in the
    Hugging Face cache; an absolute path or one escaping the folder is refused.
    """
    path = inside(folder, name)
    if path.is_dir():
        path = inside(folder, f"{name}/tokenizer.json")   # a symlink out of the folder is refused too
    if path.is_file():
        if path.suffix != ".json":
            raise CheckpointError(f"tokenizer {name!r} names {path}, not a tokenizer.json file")
        return path
    try:
        return resolve_tokenizer(name, folder)
    except FileNotFoundError as exc:
        raise CheckpointError(str(exc)) from exc


# ------------------------------------------------------------------ normalization statistics
def load_stats(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """Flat ``feature.stat`` safetensors (LeRobot processor state) -> {feature: {stat: array}}."""
    if not path.is_file():
        raise CheckpointError(f"missing normalization statistics {path.name} in {path.parent}")
    if path.stat().st_size > MAX_STATS_BYTES:
        raise CheckpointError(f"normalization statistics {path} are larger than {MAX_STATS_BYTES} bytes")
    for key, info in read_safetensors_header(path).items():
        if info.dtype not in FLOAT_DTYPES + ("F64",):
            raise CheckpointError(f"{path.name}: statistic {key} is {info.dtype}; statistics must be floats")
    try:
        flat = load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise CheckpointError(f"cannot read normalization statistics {path}: {exc}") from exc
    stats: dict[str, dict[str, np.ndarray]] = {}
    for key, value in flat.items():
        feature, _, stat = key.rpartition(".")
        stats.setdefault(feature, {})[stat] = value.astype(np.float32)
    return stats


def pipeline_steps(folder: Path, config_name: str) -> Optional[list[dict]]:
    """Return the ``steps`` of a LeRobot processor pipeline file, or None when the file is absent."""
    path = inside(folder, config_name)
    if not path.is_file():
        return None
    steps = read_json(path).get("steps", [])
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise CheckpointError(f"{config_name}: 'steps' must be a list of objects")
    return steps


def _step_config(config_name: str, entry: dict) -> dict:
    cfg = entry.get("config", {})
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{config_name}: the config of step {entry.get('registry_name')!r} must be an object")
    return cfg


def lerobot_processor_stats(folder: Path, config_name: str, step: str) -> tuple[dict, dict, float]:
    """Statistics, norm map and eps of the ``step`` of a LeRobot processor pipeline file."""
    steps = pipeline_steps(folder, config_name)
    if steps is None:
        raise CheckpointError(f"missing {config_name} in {folder}")
    for entry in steps:
        if entry.get("registry_name") == step:
            cfg = _step_config(config_name, entry)
            state_file = config_value(entry, "state_file", str, "", f"{config_name} step {step}")
            if not state_file:
                raise CheckpointError(f"{config_name}: step {step} names no state_file")
            norm_map = config_value(cfg, "norm_map", dict, {}, f"{config_name} step {step}")
            eps = config_value(cfg, "eps", (int, float), 1e-8, f"{config_name} step {step}")
            if not (math.isfinite(eps) and eps >= 0):
                raise CheckpointError(f"{config_name} step {step}: eps must be finite and >= 0, got {eps}")
            return load_stats(inside(folder, state_file)), norm_map, float(eps)
    raise CheckpointError(f"{config_name} has no {step} step")


def processor_step_config(folder: Path, config_name: str, step: str) -> Optional[dict]:
    """Return the ``config`` of one step of a LeRobot processor pipeline, or None if absent."""
    for entry in pipeline_steps(folder, config_name) or []:
        if entry.get("registry_name") == step:
            return _step_config(config_name, entry)
    return None


def lerobot_normalizers(folder: Path, state_key: str = "observation.state") -> tuple[Normalizer, Normalizer]:
    """(state normalizer, action un-normalizer) from LeRobot's pre/post-processor files."""
    pre, pre_map, eps = lerobot_processor_stats(folder, "policy_preprocessor.json", "normalizer_processor")
    post, post_map, post_eps = lerobot_processor_stats(folder, "policy_postprocessor.json", "unnormalizer_processor")
    try:
        state = Normalizer(pre_map.get("STATE", "IDENTITY"), pre.get(state_key, {}), eps)
        action = Normalizer(post_map.get("ACTION", "IDENTITY"), post.get("action", {}), post_eps)
    except (TypeError, ValueError) as exc:   # TypeError: a mode that is not a string
        raise CheckpointError(f"{folder}: normalization statistics: {exc}") from exc
    return state, action
