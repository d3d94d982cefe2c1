# SPDX-License-Identifier: Apache-2.0
"""
vla-policy-train --export-from a folder LeRobot saved, and its refusals.

test/fixtures/lerobot061/smolvla was saved by LeRobot 0.6.1 (``save_pretrained``; its backbone folder is
``tiny_smolvlm``, not the ``vlm`` an export writes): tools/lerobot/make_fixtures.py.
"""

import json
from pathlib import Path
import shutil

from vla_policy_node.train.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot061"


def test_a_lerobot_saved_folder_with_another_backbone_name_exports(tmp_path, capsys):
    assert json.loads((FIXTURES / "smolvla/config.json").read_text())["vlm_model_name"] == "tiny_smolvlm"
    out = tmp_path / "export"
    assert main(["--export-from", str(FIXTURES / "smolvla"), "--output", str(out), "--lerobot-version", "0.6"]) == 0
    printed = capsys.readouterr().out
    assert "max |action difference| through load_policy: 0.00e+00" in printed
    assert f"cd {out} && HF_HUB_OFFLINE=1" in printed
    assert json.loads((out / "config.json").read_text())["vlm_model_name"] == "vlm"
    assert (out / "vlm" / "tokenizer.json").is_file() and not (out / "tiny_smolvlm").exists()


def test_a_refused_export_is_one_line_and_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "export"
    assert main(["--export-from", str(FIXTURES / "pi0"), "--output", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "only SmolVLA checkpoints can be exported, got type 'pi0'" in err
    assert not out.exists()
    broken = tmp_path / "broken"
    shutil.copytree(FIXTURES / "smolvla", broken)
    (broken / "model.safetensors").write_bytes(b"\0" * 16)
    assert main(["--export-from", str(broken), "--output", str(out)]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1 and not out.exists()


def test_a_refused_export_keeps_a_folder_that_was_there(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["--export-from", str(FIXTURES / "pi0"), "--output", str(out)]) == 1
    assert (out / "notes.txt").read_text() == "keep me"


def test_an_embedding_with_more_rows_than_tokenizer_ids_exports(tmp_path):
    """The bench's SmolVLA-size checkpoint: 49,280 embedding rows, a 265-id tokenizer (here 339 rows -> 600)."""
    import numpy as np
    import torch

    from vla_policy_node.loading import load_policy
    from vla_policy_node.train import export

    saved = export.read_checkpoint(FIXTURES / "smolvla")
    module = saved.model.get_submodule(export.EMBED_KEY.rsplit(".", 1)[0])
    rows = module.weight.shape[0]
    assert saved.tokenizer.get_vocab_size(with_added_tokens=True) < 600
    padding = torch.zeros(600 - rows, module.weight.shape[1])
    module.weight = torch.nn.Parameter(torch.cat([module.weight.detach(), padding]))
    export.save_checkpoint(tmp_path / "out", saved.model, saved.config, saved.vlm_config, saved.tokenizer,
                           saved.state_stats, saved.action_stats, "0.6", saved.settings)
    assert json.loads((tmp_path / "out/vlm/config.json").read_text())["text_config"]["vocab_size"] == 600
    obs = export.sample_observation(saved.config, seed=0)
    noise = np.random.default_rng(1).standard_normal((1, 8, 32)).astype(np.float32)
    before = load_policy(FIXTURES / "smolvla", device="cpu").predict_action_chunk(obs, noise=noise)
    after = load_policy(tmp_path / "out", device="cpu").predict_action_chunk(obs, noise=noise)
    np.testing.assert_allclose(after, before, atol=1e-5)
