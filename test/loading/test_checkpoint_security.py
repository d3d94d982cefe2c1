# SPDX-License-Identifier: Apache-2.0
"""
Corrupted and hostile checkpoint folders: each is refused with a clear ``CheckpointError``.

Every case starts from a writable copy of the SmolVLA reference fixture in
``tmp_path`` and breaks one thing. The loader must say what is wrong, never
crash with another exception, hang, allocate what a header claims, or unpickle.
"""

import dataclasses
import json
import os
import pickle
import resource
import shutil
import struct
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors.torch import load_file, save_file

from conftest import REFERENCE
from vla_policy_node.loading import weights
from vla_policy_node.loading.checkpoint import CheckpointError, read_safetensors_header
from vla_policy_node.loading import load_policy

FIXTURE = REFERENCE / "smolvla"
FILES = ("config.json", "model.safetensors", "policy_preprocessor.json", "policy_postprocessor.json",
         "policy_preprocessor_step_5_normalizer_processor.safetensors",
         "policy_postprocessor_step_0_unnormalizer_processor.safetensors")
STATE_STATS = "policy_preprocessor_step_5_normalizer_processor.safetensors"
EXPERT_KEY = "model.action_in_proj.weight"

pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(), reason=f"reference fixture not found at {FIXTURE}")


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """Make a writable copy of the fixture's small files (never committed into the repository)."""
    folder = tmp_path / "ckpt"
    (folder / "tiny_smolvlm").mkdir(parents=True)
    for name in FILES:
        shutil.copyfile(FIXTURE / name, folder / name)
    for f in (FIXTURE / "tiny_smolvlm").iterdir():
        shutil.copyfile(f, folder / "tiny_smolvlm" / f.name)
    return folder


def load(folder: Path):
    return load_policy(folder, device="cpu", allowed_roots=[folder.parent])


def refused(folder: Path, *fragments: str) -> str:
    """Load, expect ``CheckpointError``, check the message names every fragment; return it."""
    with pytest.raises(CheckpointError) as info:
        load(folder)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def edit_tensors(folder: Path, change) -> None:
    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def raw_header(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def write_raw(path: Path, header: dict, body: bytes) -> None:
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + body)


def test_the_intact_copy_loads(ckpt):
    assert load(ckpt).family == "smolvla"


def test_one_checkpoint_error_class():
    assert weights.CheckpointError is CheckpointError


# ------------------------------------------------------------------ weights file
def test_truncated_weights(ckpt):
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    refused(ckpt, "model.safetensors is truncated", "the file holds")


def test_file_too_short_for_a_header(ckpt):
    (ckpt / "model.safetensors").write_bytes(b"\x01\x02\x03")
    refused(ckpt, "too short to be a safetensors file")


def test_header_length_beyond_the_file(ckpt):
    path = ckpt / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 2**60) + path.read_bytes()[8:])
    refused(ckpt, "header claims", "truncated or not safetensors")


def test_header_claiming_a_huge_tensor_is_refused_before_allocation(ckpt):
    """A shape of 10^12 elements with the real byte range: refused, nothing allocated."""
    path = ckpt / "model.safetensors"
    header, body = raw_header(path)
    header[EXPERT_KEY]["shape"] = [10**6, 10**6]
    write_raw(path, header, body)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refused(ckpt, EXPERT_KEY, "data_offsets span")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 512 * 1024   # KiB


def test_header_offsets_past_the_end_of_the_file(ckpt):
    path = ckpt / "model.safetensors"
    header, body = raw_header(path)
    last = max(header.items(), key=lambda kv: kv[1]["data_offsets"][1] if kv[0] != "__metadata__" else -1)[1]
    last["shape"] = [last["shape"][0] * 1000] + last["shape"][1:]
    begin, end = last["data_offsets"]
    last["data_offsets"] = [begin, begin + (end - begin) * 1000]
    write_raw(path, header, body)
    refused(ckpt, "model.safetensors is truncated")


def test_overlapping_tensors(ckpt):
    path = ckpt / "model.safetensors"
    header, body = raw_header(path)
    entries = sorted((v["data_offsets"], k) for k, v in header.items() if k != "__metadata__")
    (b0, e0), first = entries[0]
    header[entries[1][1]]["data_offsets"] = [b0, e0]
    header[entries[1][1]]["shape"] = header[first]["shape"]
    write_raw(path, header, body)
    refused(ckpt, "overlap or leave a gap")


def test_header_that_is_not_json(ckpt):
    path = ckpt / "model.safetensors"
    header, body = raw_header(path)
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + b"#" + encoded[1:] + body)
    refused(ckpt, "safetensors header is not valid JSON")


def test_wrong_shape(ckpt):
    edit_tensors(ckpt, lambda t: t.__setitem__(EXPERT_KEY, t[EXPERT_KEY].t().contiguous()))
    refused(ckpt, EXPERT_KEY, "has shape", "expects")


@pytest.mark.parametrize("dtype, name", [(torch.int32, "I32"), (torch.int64, "I64"), (torch.float64, "F64")])
def test_wrong_dtype(ckpt, dtype, name):
    edit_tensors(ckpt, lambda t: t.__setitem__(EXPERT_KEY, t[EXPERT_KEY].to(dtype)))
    refused(ckpt, EXPERT_KEY, f"dtype {name}", "float32, bfloat16 or float16")


def test_half_precision_weights_are_accepted(ckpt):
    edit_tensors(ckpt, lambda t: t.update({k: v.to(torch.bfloat16) for k, v in t.items()}))
    assert load(ckpt).dtype == torch.float32


def test_missing_tensor(ckpt):
    edit_tensors(ckpt, lambda t: t.pop(EXPERT_KEY))
    refused(ckpt, "missing tensors", "action_in_proj.weight")


def test_extra_tensor(ckpt):
    edit_tensors(ckpt, lambda t: t.__setitem__("model.backdoor.weight", torch.zeros(3)))
    refused(ckpt, "unexpected tensors", "model.backdoor.weight")


# ------------------------------------------------------------------ pickles
class Payload:
    """Unpickling this creates ``marker``: proof that a pickle was loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickle_checkpoint_is_refused_and_never_unpickled(ckpt, tmp_path):
    marker = tmp_path / "unpickled"
    (ckpt / "model.safetensors").unlink()
    (ckpt / "pytorch_model.bin").write_bytes(pickle.dumps(Payload(marker)))
    message = refused(ckpt, "pytorch_model.bin", "pickle", "arbitrary code", "safetensors")
    assert "Convert" in message
    assert not marker.exists()


def test_pickle_renamed_to_safetensors_is_not_unpickled(ckpt, tmp_path):
    marker = tmp_path / "unpickled"
    (ckpt / "model.safetensors").write_bytes(pickle.dumps(Payload(marker)) + bytes(64))
    refused(ckpt, "model.safetensors")
    assert not marker.exists()


def test_pickle_beside_safetensors_is_ignored(ckpt, tmp_path):
    marker = tmp_path / "unpickled"
    (ckpt / "pytorch_model.bin").write_bytes(pickle.dumps(Payload(marker)))
    load(ckpt)
    assert not marker.exists()


# ------------------------------------------------------------------ paths
def test_checkpoint_outside_the_allowed_roots(ckpt, tmp_path):
    elsewhere = tmp_path / "allowed"
    elsewhere.mkdir()
    with pytest.raises(CheckpointError, match="outside the allowed roots"):
        load_policy(ckpt, device="cpu", allowed_roots=[elsewhere])


def test_symlink_into_allowed_root_pointing_outside(ckpt, tmp_path):
    root = tmp_path / "allowed"
    root.mkdir()
    (root / "link").symlink_to(ckpt, target_is_directory=True)
    with pytest.raises(CheckpointError, match="outside the allowed roots"):
        load_policy(root / "link", device="cpu", allowed_roots=[root])


def test_symlinked_weights_escaping_the_folder(ckpt, tmp_path):
    outside = tmp_path / "outside.safetensors"
    (ckpt / "model.safetensors").rename(outside)
    (ckpt / "model.safetensors").symlink_to(outside)
    refused(ckpt, "outside the checkpoint folder")


def test_symlinked_tokenizer_escaping_the_folder(ckpt, tmp_path):
    tok = ckpt / "tiny_smolvlm" / "tokenizer.json"
    tok.rename(tmp_path / "tokenizer.json")
    tok.symlink_to(tmp_path / "tokenizer.json")
    refused(ckpt, "tokenizer.json", "outside the checkpoint folder")


@pytest.mark.parametrize("name", ["../ckpt_vlm", "/etc", "tiny_smolvlm/../../x"])
def test_backbone_name_escaping_the_folder(ckpt, name):
    shutil.copytree(ckpt / "tiny_smolvlm", ckpt.parent / "ckpt_vlm")
    edit_json(ckpt / "config.json", vlm_model_name=name)
    refused(ckpt, name)


def edit_step(folder: Path, file: str, step: str, **changes) -> None:
    path = folder / file
    data = json.loads(path.read_text())
    for entry in data["steps"]:
        if entry["registry_name"] == step:
            for key, value in changes.items():
                (entry if key == "state_file" else entry["config"])[key] = value
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("name", ["../../etc", "/usr/share", "../ckpt/tiny_smolvlm/../../x"])
def test_tokenizer_name_escaping_the_folder(ckpt, name):
    edit_step(ckpt, "policy_preprocessor.json", "tokenizer_processor", tokenizer_name=name)
    refused(ckpt, "outside the checkpoint folder" if not name.startswith("/") else "absolute path")


@pytest.mark.parametrize("name", ["../stats.safetensors", "/tmp/stats.safetensors"])
def test_state_file_escaping_the_folder(ckpt, name):
    shutil.copyfile(ckpt / STATE_STATS, ckpt.parent / "stats.safetensors")
    edit_step(ckpt, "policy_preprocessor.json", "normalizer_processor", state_file=name)
    refused(ckpt, name)


def test_statistics_with_integer_dtype(ckpt):
    stats = {k: v.to(torch.int32) for k, v in load_file(str(ckpt / STATE_STATS)).items()}
    save_file(stats, str(ckpt / STATE_STATS))
    refused(ckpt, STATE_STATS, "statistics must be floats")


def test_missing_statistics(ckpt):
    (ckpt / STATE_STATS).unlink()
    refused(ckpt, "missing normalization statistics", STATE_STATS)


# ------------------------------------------------------------------ configs
def test_config_that_is_not_json(ckpt):
    (ckpt / "config.json").write_text('{"type": "smolvla",')
    refused(ckpt, "config.json is not valid JSON")


def test_config_that_is_not_an_object(ckpt):
    (ckpt / "config.json").write_text("[1, 2]")
    refused(ckpt, "must hold a JSON object")


@pytest.mark.parametrize("family", ["gpt2", None, ["smolvla"], 7])
def test_unknown_policy_type(ckpt, family):
    edit_json(ckpt / "config.json", type=family)
    refused(ckpt, "unknown policy type", "supported:", "'smolvla'")


@pytest.mark.parametrize("changes, fragment", [
    ({"chunk_size": "8"}, "chunk_size must be an integer"),
    ({"chunk_size": 8.0}, "chunk_size must be an integer"),
    ({"num_steps": True}, "num_steps must be an integer"),
    ({"min_period": "small"}, "min_period must be a finite number"),
    ({"input_features": ["observation.state"]}, "invalid SmolVLA configuration"),
    ({"output_features": {"action": {"shape": ["six"]}}}, "invalid SmolVLA configuration"),
    ({"vlm_model_name": 3}, "vlm_model_name must be str"),
    ({"max_state_dim": 2}, "invalid SmolVLA configuration"),
    ({"min_period": -0.004}, "need 0 < min_period < max_period"),     # once NaN actions after a clean load
    ({"min_period": 0.0}, "need 0 < min_period < max_period"),
    ({"max_period": 0.0}, "need 0 < min_period < max_period"),
    ({"chunk_size": 0}, "chunk_size must be > 0"),
    ({"num_steps": -1}, "num_steps must be > 0"),
    ({"resize_imgs_with_padding": [64]}, "resize_imgs_with_padding must be [width, height]"),
    ({"resize_imgs_with_padding": [0, 0]}, "resize_imgs_with_padding must be two positive sizes"),
])
def test_config_with_wrong_types(ckpt, changes, fragment):
    edit_json(ckpt / "config.json", **changes)
    refused(ckpt, fragment)


def test_tokenizer_step_with_wrong_types(ckpt):
    edit_step(ckpt, "policy_preprocessor.json", "tokenizer_processor", max_length="24")
    refused(ckpt, "max_length must be int")


@pytest.mark.parametrize("changes, fragment", [
    ({"max_length": 0}, "max_length must be in 1..4096"),
    ({"max_length": 10**9}, "max_length must be in 1..4096"),
    ({"padding": "do_not_pad"}, "padding must be 'max_length' or 'longest'"),
])
def test_tokenizer_step_with_values_that_cannot_work(ckpt, changes, fragment):
    edit_step(ckpt, "policy_preprocessor.json", "tokenizer_processor", **changes)
    refused(ckpt, fragment)


def test_absurd_layer_count_fails_fast(ckpt):
    edit_json(ckpt / "config.json", num_vlm_layers=500, num_expert_layers=500)    # within the size bound
    start = time.monotonic()
    refused(ckpt, "num_layers = 500", "tensors")
    assert time.monotonic() - start < 10


def test_config_describing_a_huge_model_allocates_nothing(ckpt):
    """A 0.5 GB embedding per config.json (within the bound): the meta-device check refuses it unallocated."""
    edit_json(ckpt / "tiny_smolvlm" / "config.json",
              text_config={**json.loads((FIXTURE / "tiny_smolvlm" / "config.json").read_text())["text_config"],
                           "vocab_size": 2 * 10**6})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refused(ckpt, "embed_tokens.weight", "has shape")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 512 * 1024   # KiB


# ------------------------------------------------------------------ header fuzz
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_headers_give_checkpoint_errors_only(tmp_path, data):
    """Random byte edits of a real header: a parsed header or ``CheckpointError``, nothing else."""
    src = FIXTURE / STATE_STATS
    raw = bytearray(src.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, 8 + n - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        del raw[data.draw(st.integers(0, len(raw))):]
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(bytes(raw))
    try:
        read_safetensors_header(path)
    except CheckpointError as exc:
        assert str(exc)
    os.remove(path)


@pytest.mark.parametrize("changes, fragment", [
    ({"resize_imgs_with_padding": [60000, 60000]}, "image_size = (60000, 60000) is beyond 4096"),
    ({"chunk_size": 2**30, "n_action_steps": 2**30}, "chunk_size = 1073741824 is beyond 1024"),
    ({"num_steps": 10**6}, "num_steps = 1000000 is beyond 1000"),
    ({"max_action_dim": 10**6}, "max_action_dim = 1000000 is beyond 4096"),
])
def test_declared_sizes_beyond_their_bounds_are_refused_before_anything_is_allocated(ckpt, changes, fragment):
    """Each once grew the node by tens of GB or ended the warm-up in an allocator traceback."""
    edit_json(ckpt / "config.json", **changes)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refused(ckpt, fragment)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024   # KiB: nothing large


def test_a_model_that_does_not_fit_the_free_memory_is_refused_with_the_figures(ckpt, monkeypatch):
    from vla_policy_node.loading import sizes
    monkeypatch.setattr(sizes, "available_bytes", lambda device: 2**20)
    refused(ckpt, "needs about", "GiB is free")


def test_the_working_memory_estimate_grows_with_the_declared_sizes(ckpt):
    from vla_policy_node.loading import sizes
    policy = load(ckpt)
    cfg = policy.model.config
    small = sizes.working_bytes(cfg, 1)
    assert sizes.working_bytes(dataclasses.replace(cfg, image_size=(4096, 4096)), 1) > 100 * small
    assert sizes.working_bytes(cfg, 3) > 2 * small and 0 < small < 2**30
