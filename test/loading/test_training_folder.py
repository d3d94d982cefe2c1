# SPDX-License-Identifier: Apache-2.0
"""A LeRobot training folder (``lerobot-train``'s output) resolves to the ``pretrained_model/`` it saved."""

import json
import logging
import shutil
from pathlib import Path

import pytest

from vla_policy_node.loading import load_policy
from vla_policy_node.loading.checkpoint import checkpoint_dir, CheckpointError

SMOLVLA = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot061" / "smolvla"


@pytest.fixture
def run(tmp_path):
    """``outputs/train/<run>`` as lerobot-train leaves it: steps 10 and 20, ``last`` linking 20."""
    run = tmp_path / "outputs" / "train" / "run"
    for step in ("000010", "000020"):
        model = run / "checkpoints" / step / "pretrained_model"
        model.mkdir(parents=True)
        (model / "config.json").write_text(json.dumps({"type": "smolvla", "step": step}))
        (run / "checkpoints" / step / "training_state").mkdir()
    (run / "checkpoints" / "last").symlink_to("000020")
    return run


@pytest.mark.parametrize("given, step", [("checkpoints/last", "000020"), ("checkpoints/000010", "000010"),
                                         ("checkpoints", "000020"), ("", "000020")])
def test_a_training_folder_resolves_to_its_pretrained_model_with_a_log_line(run, caplog, given, step):
    with caplog.at_level(logging.INFO, logger="vla_policy_node.loading.checkpoint"):
        folder = checkpoint_dir(run / given)
    assert folder == (run / "checkpoints" / step / "pretrained_model").resolve()
    assert "is a LeRobot training folder" in caplog.text and str(folder) in caplog.text


def test_the_allowed_roots_apply_to_the_folder_loaded(run, tmp_path):
    with pytest.raises(CheckpointError, match="outside the allowed roots"):
        checkpoint_dir(run / "checkpoints" / "last", allowed_roots=[run / "checkpoints" / "000010"])
    assert checkpoint_dir(run, allowed_roots=[run]).name == "pretrained_model"


def test_a_policy_loads_from_the_path_lerobot_prints(tmp_path):
    step = tmp_path / "run" / "checkpoints" / "000005"
    shutil.copytree(SMOLVLA, step / "pretrained_model")
    (tmp_path / "run" / "checkpoints" / "last").symlink_to("000005")
    policy = load_policy(tmp_path / "run" / "checkpoints" / "last", device="cpu")
    assert policy.chunk_size == 8 and len(policy.camera_names) == 3
