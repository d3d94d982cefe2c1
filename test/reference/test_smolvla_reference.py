# SPDX-License-Identifier: Apache-2.0
"""SmolVLA against LeRobot 0.4.4: the reference fixture, loaded through ``load_policy``."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from vla_policy_node.model.families.smolvla import SmolVLA, SmolVLAConfig, key_rules
from vla_policy_node.runtime.engine import PolicyRuntime
from vla_policy_node.model.types import ModelInputs
from vla_policy_node.loading.weights import load_weights, prefix_key_map
from vla_policy_node.loading import load_policy

TOL = 1e-5


@pytest.fixture(scope="module")
def fixture(request):
    from conftest import REFERENCE
    folder = REFERENCE / "smolvla"
    if not folder.is_dir():
        pytest.skip(f"reference fixtures not found at {folder}")
    return folder, load_file(folder / "inputs.safetensors"), load_file(folder / "expected.safetensors")


def raw_observation(inp):
    return {"images": {"top": inp["raw.observation.images.top"][0].numpy(),
                       "observation.images.wrist": inp["raw.observation.images.wrist"][0].numpy()},
            "state": inp["raw.observation.state"][0].numpy(), "task": "pick up the red cube"}


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_end_to_end_from_raw_frames(fixture, backend):
    folder, inp, exp = fixture
    policy = load_policy(folder, device="cpu", attention_backend=backend)
    pre = policy.preprocessor(raw_observation(inp))
    assert torch.equal(pre.tokens, inp["batch.observation.language.tokens"])
    assert torch.equal(pre.token_mask, inp["batch.observation.language.attention_mask"])
    for i in range(2):
        torch.testing.assert_close(pre.images[i], inp[f"model_input.image.{i}"], atol=1e-6, rtol=0)
    torch.testing.assert_close(pre.state, inp["model_input.state_padded"], atol=1e-6, rtol=0)
    chunk = policy.predict_action_chunk(raw_observation(inp), noise=inp["noise"].numpy())
    assert chunk.shape == (1, 8, 6)
    np.testing.assert_allclose(chunk, exp["action_chunk"].numpy(), atol=5 * TOL, rtol=0)


def test_intermediates_match(fixture):
    folder, inp, exp = fixture
    cfg = SmolVLAConfig.from_lerobot(json.loads((folder / "config.json").read_text()),
                                     json.loads((folder / "tiny_smolvlm" / "config.json").read_text()))
    model = SmolVLA(cfg, "eager").eval()
    load_weights(model, folder / "model.safetensors", prefix_key_map(key_rules()))
    inputs = ModelInputs(images=[inp["model_input.image.0"], inp["model_input.image.1"]],
                         image_masks=[inp["model_input.image_mask.0"], inp["model_input.image_mask.1"]],
                         tokens=inp["batch.observation.language.tokens"],
                         token_mask=inp["batch.observation.language.attention_mask"],
                         state=inp["model_input.state_padded"])
    assert torch.equal(model.vision_position_ids, exp["vision_position_ids"][0])
    with torch.no_grad():
        emb, pad, ar = model.embed_prefix(inputs)
    torch.testing.assert_close(emb, exp["prefix_embs"], atol=1e-4, rtol=0)   # values up to ~40 (x sqrt(64))
    assert torch.equal(pad, exp["prefix_pad_masks"])
    assert torch.equal(ar.bool(), exp["prefix_att_masks"])
    rt = PolicyRuntime(model, cfg.num_steps, torch.device("cpu"))
    torch.testing.assert_close(rt.timesteps, exp["timesteps"], atol=0, rtol=0)
    velocities = []
    inner = rt.velocity_fn

    def recording(ctx):
        fn = inner(ctx)

        def velocity(x, k):
            v = fn(x, k)
            velocities.append(v.clone())
            return v
        return velocity

    rt.velocity_fn = recording
    out = rt.sample(inputs, inp["noise"])
    # The cache holds no prompt position that is padding in every row (``without_shared_padding``).
    n_image_tokens = pad.shape[1] - inputs.tokens.shape[1] - 1
    kept = torch.cat([torch.ones(n_image_tokens, dtype=torch.bool), inputs.token_mask.bool().any(0),
                      torch.ones(1, dtype=torch.bool)])
    assert not kept.all()
    for layer, name in ((0, "layer0"), (3, "layer3")):
        k, v = rt.cache.layer(layer)
        torch.testing.assert_close(k.transpose(1, 2), exp[f"prefix_kv.{name}.key"][:, kept], atol=TOL, rtol=0)
        torch.testing.assert_close(v.transpose(1, 2), exp[f"prefix_kv.{name}.value"][:, kept], atol=TOL, rtol=0)
    torch.testing.assert_close(torch.stack(velocities), exp["velocities"], atol=TOL, rtol=0)
    torch.testing.assert_close(out, exp["x_final_padded"], atol=TOL, rtol=0)
    torch.testing.assert_close(out[..., :6], exp["action_chunk_normalized"], atol=TOL, rtol=0)


def test_relative_tokenizer_resolves_against_checkpoint_not_cwd(fixture, tmp_path, monkeypatch):
    folder, inp, exp = fixture
    monkeypatch.chdir(tmp_path)
    policy = load_policy(folder, device="cpu")
    assert policy.preprocessor.tokenizer.path.parent == folder.resolve() / "tiny_smolvlm"


def test_weights_not_used_at_inference_are_not_loaded(fixture):
    folder, _, _ = fixture
    policy = load_policy(folder, device="cpu")
    names = dict(policy.model.named_parameters())
    assert not any("lm_head" in n for n in names)
    assert sum(p.numel() for p in names.values()) < 419968      # the fixture's full parameter count


def test_bfloat16_keeps_sensitive_parts_in_float32(fixture):
    folder, inp, exp = fixture
    policy = load_policy(folder, device="cpu", dtype="bfloat16")
    m = policy.model
    for name in m.FLOAT32_MODULES:
        assert all(p.dtype == torch.float32 for p in m.get_submodule(name).parameters()), name
    assert m.vlm_layers[0].input_layernorm.weight.dtype == torch.float32
    assert m.vlm_layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    chunk = policy.predict_action_chunk(raw_observation(inp), noise=inp["noise"].numpy())
    ref = exp["action_chunk_normalized"].numpy()
    normalized = policy.action_normalizer.normalize(chunk)
    assert np.abs(normalized - ref).max() < 0.1


def test_loading_and_running_eager_leaves_nothing_in_the_temp_folder(fixture, tmp_path):
    """No compiler involved, so nothing may import torch._dynamo (its import makes inductor's temp cache folder)."""
    folder = fixture[0]
    temp = tmp_path / "temp"
    temp.mkdir()
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from safetensors.torch import load_file
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]
        from test_smolvla_reference import raw_observation
        from vla_policy_node.loading import load_policy
        folder = Path({str(folder)!r})
        inp = load_file(folder / "inputs.safetensors")
        policy = load_policy(folder, device="cpu")
        policy.predict_action_chunk(raw_observation(inp), noise=inp["noise"].numpy())
        for family in ("pi0", "pi05"):
            load_policy(folder.parent / family, device="cpu")
        print("torch._dynamo" in sys.modules)
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    env.update(TMPDIR=str(temp), PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == "False"
    assert sorted(os.listdir(temp)) == []
