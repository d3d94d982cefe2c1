# SPDX-License-Identifier: Apache-2.0
"""The bench's ``pi0`` configuration: published dimensions, LeRobot's file layout, memory, LeRobot skipped."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
import torch

from vla_policy_node.bench import checkpoints, cli, measure, memory
from vla_policy_node.model import packed_linear
from vla_policy_node.loading.checkpoint import read_safetensors_header
from vla_policy_node.model.families import pi0 as pi0_family
from vla_policy_node.model.families.paligemma import GEMMA_VARIANTS, GemmaDims
from vla_policy_node.loading.weights import prefix_key_map
from vla_policy_node.loading import load_policy

# Small enough for a unit test, large enough that oneDNN packs some linears (>= 2^16 weights), and
# 224x224 cameras: 256 tokens each, as at the real size.
SMALL_DIMS = {"vlm": {"width": 256, "depth": 2, "mlp_dim": 1024, "num_heads": 8, "num_kv_heads": 1, "head_dim": 32},
              "expert": {"width": 128, "depth": 2, "mlp_dim": 512, "num_heads": 8, "num_kv_heads": 1, "head_dim": 32},
              "vision": {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
                         "num_attention_heads": 2, "patch_size": 14},
              "vocab_size": 512, "image_size": 224}


def test_pi0_has_the_published_dimensions():
    cfg = checkpoints.pi0_model_config(1)
    b = cfg.backbone
    assert b.vlm == GemmaDims(width=2048, depth=18, mlp_dim=16_384, num_heads=8, num_kv_heads=1, head_dim=256)
    assert b.expert == GemmaDims(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256)
    assert (b.vlm, b.expert) == (GEMMA_VARIANTS["gemma_2b"], GEMMA_VARIANTS["gemma_300m"])
    v = b.vision                                                            # SigLIP So400m/14
    assert (v.width, v.num_layers, v.num_heads, v.mlp_width, v.patch_size) == (1152, 27, 16, 4304, 14)
    assert v.image_size == 224 and v.num_patches == 256                     # 256 tokens per 224x224 camera
    assert b.vocab_size == 257_152
    assert (cfg.num_steps, cfg.chunk_size, cfg.tokenizer_max_length) == (10, 50, 48)
    assert (cfg.max_state_dim, cfg.max_action_dim) == (32, 32)
    with torch.device("meta"):
        model = pi0_family.Pi0(cfg)
    held = sum(p.numel() for p in model.parameters())
    in_file = held + 257_152 * 1024 + 2048                                  # + the expert's LM head, the VLM's norm
    assert 3.2e9 < held < 3.3e9 and 3.45e9 < in_file < 3.55e9             # "pi0 is about 3.5 B parameters"
    for cameras in (1, 2, 3):
        assert checkpoints.pi0_model_config(cameras).camera_names == tuple(
            f"observation.images.cam{i}" for i in range(cameras))


def test_pi0_config_json_has_lerobot_pi0_fields(reference_dir):
    ref = json.loads((reference_dir("pi0") / "config.json").read_text())
    ours = checkpoints.pi0_lerobot_config(2)
    assert list(ours) == list(ref)                                          # every field, in LeRobot's order
    fixture_specific = {"input_features", "output_features", "chunk_size", "n_action_steps", "num_inference_steps",
                        "image_resolution"}
    assert {k: v for k, v in ours.items() if k not in fixture_specific} == \
        {k: v for k, v in ref.items() if k not in fixture_specific}
    assert (ours["chunk_size"], ours["num_inference_steps"], ours["image_resolution"]) == (50, 10, [224, 224])


def test_pi0_file_layout_is_lerobots(reference_dir, tmp_path):
    """At the fixture's own sizes the written file has LeRobot's names, shapes, dtypes and tie metadata."""
    ref_dir = reference_dir("pi0")
    dims = json.loads((ref_dir / "tiny_dims.json").read_text())
    folder = checkpoints.save_random_pi0_checkpoint(tmp_path / "ck", cameras=2, dtype="float32", dims=dims)
    ours, ref = read_safetensors_header(folder / "model.safetensors"), read_safetensors_header(
        ref_dir / "model.safetensors")
    assert sorted(ours) == sorted(ref)
    assert {k: (i.shape, i.dtype) for k, i in ours.items()} == {k: (i.shape, i.dtype) for k, i in ref.items()}
    with safe_open(str(folder / "model.safetensors"), "pt") as a, safe_open(str(ref_dir / "model.safetensors"),
                                                                            "pt") as b:
        assert a.metadata() == b.metadata()
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        steps = [s["registry_name"] for s in json.loads((folder / name).read_text())["steps"]]
        assert steps == [s["registry_name"] for s in json.loads((ref_dir / name).read_text())["steps"]]


def test_pi0_keys_round_trip_through_the_family_rules():
    with torch.device("meta"):
        model = pi0_family.Pi0(checkpoints.pi0_model_config(1, SMALL_DIMS))
    state = model.state_dict()
    saved = checkpoints.pi0_lerobot_keys(state)
    forward = prefix_key_map(pi0_family.key_rules())
    assert {forward(k) for k in saved} == set(state)
    assert all(k.startswith("model.") for k in saved)
    assert checkpoints.PI0_HEAD_KEY in saved and checkpoints.PI0_EMBED_KEY not in saved
    for key in (checkpoints.PI0_VLM_NORM_KEY, checkpoints.PI0_EXPERT_HEAD_KEY):
        assert forward(key) is None                                         # written for LeRobot, skipped by us


def test_write_safetensors_streams_a_valid_file(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"b.weight": torch.randn(3, 5, generator=g).bfloat16(), "a": torch.arange(7, dtype=torch.float32),
               "lazy": checkpoints.Lazy((4, 2), torch.float16, lambda: torch.ones(4, 2, dtype=torch.float16))}
    n = checkpoints.write_safetensors(tmp_path / "x.safetensors", tensors, {"k": "v"})
    assert n == (tmp_path / "x.safetensors").stat().st_size
    read_safetensors_header(tmp_path / "x.safetensors")                     # the loader's own checks
    with safe_open(str(tmp_path / "x.safetensors"), "pt") as f:
        assert f.metadata() == {"k": "v"}
        assert torch.equal(f.get_tensor("b.weight"), tensors["b.weight"])
        assert torch.equal(f.get_tensor("a"), tensors["a"])
        assert torch.equal(f.get_tensor("lazy"), torch.ones(4, 2, dtype=torch.float16))
    with pytest.raises(ValueError, match="declared"):
        checkpoints.write_safetensors(tmp_path / "y.safetensors",
                                      {"z": checkpoints.Lazy((2,), torch.float32, lambda: torch.zeros(3))})


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_pi0_checkpoint_loads_with_load_policy(tmp_path, dtype):
    info = {}
    folder = checkpoints.save_random_checkpoint(tmp_path / "ck", "pi0", 2, seed=3, dtype=dtype, info=info,
                                                pi0_dims=SMALL_DIMS)
    assert info["dtype"] == dtype and info["file_bytes"] == (folder / "model.safetensors").stat().st_size
    header = read_safetensors_header(folder / "model.safetensors")
    assert {i.dtype for i in header.values()} == {"BF16" if dtype == "bfloat16" else "F32"}
    assert info["params_in_file"] == sum(i.numel for i in header.values())

    policy = load_policy(folder, device="cpu", dtype=dtype)
    assert policy.family == "pi0" and policy.camera_names == ("observation.images.cam0", "observation.images.cam1")
    assert (policy.chunk_size, policy.num_steps, policy.state_dim) == (50, 10, checkpoints.STATE_DIM)
    # every tensor the runtime uses holds the file's values
    forward = prefix_key_map(pi0_family.key_rules())
    params = dict(policy.model.named_parameters())
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        for key in f.keys():
            name = forward(key)
            if name is not None:
                assert torch.equal(params[name].float(), f.get_tensor(key).float()), key
    # the tokenizer: <bos> first, <pad> = 0 after the text, 48 tokens
    tokens, mask = policy.preprocessor.tokenizer(["pick up the red cube\n"], 48, "max_length")
    assert tokens[0, 0] == 2 and mask[0].sum() == 1 + len("pick up the red cube\n") and tokens[0, -1] == 0
    # it runs: 2 cameras x 256 tokens + the prompt's 22 tokens in the prefix (eager code skips the padding)
    obs = {"images": {n: np.zeros((480, 640, 3), np.uint8) for n in policy.camera_names},
           "state": np.zeros(checkpoints.STATE_DIM, np.float32), "task": "pick up the red cube"}
    actions = policy.predict_action_chunk(obs)
    assert actions.shape == (1, 50, checkpoints.ACTION_DIM) and np.isfinite(actions).all()
    assert policy.runtime.cache.seq_length() == 2 * 256 + int(mask[0].sum())
    # the memory estimate's run-time figures are what the loaded policy holds
    est = memory.memory_estimate("pi0", 2, dtype, pi0_dims=SMALL_DIMS)
    held = cli.tensor_bytes(policy.model)
    assert (est.weights, est.packed) == (held["weights"], held["packed"])
    assert (held["packed"] > 0) == packed_linear.dtype_supported(getattr(torch, dtype))   # bf16: AVX-512 only


def test_flop_count_includes_packed_matmuls(tmp_path):
    folder = checkpoints.save_random_checkpoint(tmp_path / "ck", "pi0", 1, pi0_dims=SMALL_DIMS)
    counts = []
    for pack in (True, False):
        policy = load_policy(folder, device="cpu", pack_weights=pack)
        assert (cli.tensor_bytes(policy.model)["packed"] > 0) == pack
        obs, noise = cli.make_observation(policy, (480, 640), 0)
        inputs = policy.preprocessor(obs)
        counts.append(measure.count_flops(policy, inputs, torch.from_numpy(noise)))
    assert counts[0] == counts[1]
    # a lower bound: the VLM's linears over 256 + 48 prefix tokens (the last layer's MLP is skipped)
    w, d, hd = SMALL_DIMS["vlm"]["width"], SMALL_DIMS["vlm"]["depth"], SMALL_DIMS["vlm"]["head_dim"]
    attention = 2 * (2 * w * SMALL_DIMS["vlm"]["num_heads"] * hd + 2 * w * hd)
    mlp = 2 * 3 * w * SMALL_DIMS["vlm"]["mlp_dim"]
    assert counts[0]["prefix"] > (d * attention + (d - 1) * mlp) * (256 + 48)


def test_bench_refuses_a_run_that_does_not_fit(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(cli, "available_memory_bytes", lambda: 20 * 2**30)
    monkeypatch.setattr(checkpoints, "save_random_checkpoint", lambda *a, **k: pytest.fail("wrote a checkpoint"))
    assert cli.main(["pi0", "--dtype", "float32", "--json", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "pi0 float32 on cpu needs about 23." in err and "20.0 GiB is available" in err
    assert "--dtype bfloat16 (about 14." in err and "--no-pack (about 15." in err
    assert not (tmp_path / "x.json").exists()


def test_bench_pi0_end_to_end_skips_lerobot_with_the_reason(monkeypatch, tmp_path, capsys):
    # any interpreter without openpi's transformers fork takes the same path as .venv-lerobot's
    monkeypatch.setattr(cli, "LEROBOT_PYTHON", Path(sys.executable))
    out, dims = tmp_path / "pi0.json", tmp_path / "dims.json"
    dims.write_text(json.dumps(SMALL_DIMS))
    args = ["pi0", "--dtype", "bfloat16", "--iters", "2", "--warmup", "0", "--naive-iters", "1", "--threads", "1",
            "--pi0-dims", str(dims)]
    assert cli.main([*args, "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    c = r["config"]
    assert c["family"] == "pi0" and c["dtype"] == "bfloat16" and c["prompt_tokens"] == 48
    assert c["prefix_tokens"] == 256 + c["prompt_tokens_used"]            # eager code skips unused padding
    assert c["checkpoint"]["dtype"] == "bfloat16" and c["checkpoint"]["save_s"] >= 0 and c["load_s"] > 0
    assert not r["lerobot"]["available"] and "transformers.models.siglip.check" in r["lerobot"]["reason"]
    m = r["memory"]
    assert m["packed_mib"] == pytest.approx(m["estimate"]["packed_gib"] * 1024)
    assert r["naive"]["ratio"] > 1 and r["naive"]["gflops"]["prefix"] > r["naive"]["gflops"]["step"] > 0
    table = capsys.readouterr().out
    assert "LeRobot: not measured: LeRobot 0.4.4's pi0/pi0.5 need openpi's patched transformers" in table
    assert "random checkpoint:" in table and "oneDNN-packed copies" in table

    assert cli.main([*args, "--no-pack", "--naive-iters", "0", "--no-lerobot", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["memory"]["packed_mib"] == 0


@pytest.mark.skipif(not cli.LEROBOT_PYTHON.exists(), reason="no .venv-lerobot (make lerobot-env)")
def test_lerobot_venv_cannot_run_pi0():
    """Check that .venv-lerobot lacks openpi's transformers fork, without which LeRobot 0.4.4's pi0 raises."""
    reason = cli.lerobot_pi_blocker()
    assert reason is not None and "transformers.models.siglip.check" in reason
