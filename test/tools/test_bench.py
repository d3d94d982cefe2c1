# SPDX-License-Identifier: Apache-2.0
"""vla-policy-bench on the tiny configuration: the JSON carries every figure, and the figures are sane."""

import json

import pytest
import torch
import yaml

from benchmarks import matrix
from vla_policy_node.bench import checkpoints, cli, lerobot_compare
from vla_policy_node.loading import load_policy
from vla_policy_node.model import int8_linear

ARGS = ["tiny", "--iters", "2", "--warmup", "1", "--naive-iters", "1", "--threads", "1"]


def run_bench(tmp_path, *extra):
    out = tmp_path / "bench.json"
    assert cli.main([*ARGS, *extra, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_bench_json_structure_without_lerobot(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "LEROBOT_PYTHON", tmp_path / "no-venv" / "python")
    r = run_bench(tmp_path)
    assert r["config"]["family"] == "smolvla" and r["config"]["cameras"] == 1
    assert r["config"]["num_steps"] == 10 and r["config"]["chunk_size"] == 50
    # camera + the prompt positions some row uses (eager code skips the rest of max_length's 48) + state
    assert r["config"]["prompt_tokens"] == 48 and 0 < r["config"]["prompt_tokens_used"] < 48
    assert r["config"]["prefix_tokens"] == (64 // 8) ** 2 // 2 ** 2 + r["config"]["prompt_tokens_used"] + 1
    for stage in cli.STAGES:
        s = r["stages"][stage]
        assert 0 < s["median_ms"] <= s["p95_ms"] <= s["max_ms"], stage
    assert r["stages"]["denoise_step"]["n"] == 2 * 10
    assert r["stages"]["total"]["median_ms"] >= r["stages"]["prefix"]["median_ms"]
    assert r["memory"]["peak_rss_mib"] > 0 and r["memory"]["cuda_peak_mib"] is None
    naive = r["naive"]
    assert naive["max_abs_diff"] < 1e-5 and naive["ratio"] > 1
    assert 1 < naive["theoretical_ratio"] < 10 and naive["gflops"]["prefix"] > naive["gflops"]["step"] > 0
    assert r["lerobot"]["available"] is False and "make lerobot-env" in r["lerobot"]["reason"]
    flops = r["flops"]          # FLOPs per chunk and the fraction of the measured float32 matmul peak
    assert flops["gflops"]["chunk"] == pytest.approx(flops["gflops"]["prefix"] + 10 * flops["gflops"]["step"])
    assert flops["gflops"]["prefix"] == pytest.approx(naive["gflops"]["prefix"])
    assert flops["peak_gflops"] == max(flops["peak_measured"]["mkl"], flops["peak_measured"].get("onednn_packed", 0))
    assert 0 < flops["ours_fraction"] < 1 and "lerobot_fraction" not in flops
    assert len(r["stages"]["total"]["seconds"]) == 2
    table = capsys.readouterr().out
    assert "denoise step (each)" in table and "LeRobot: not measured" in table


@pytest.mark.skipif(not int8_linear.available(), reason="this torch has no x86 quantized engine")
def test_bench_int8_reports_its_distance_to_the_int8_matmul_peak(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "LEROBOT_PYTHON", tmp_path / "no-venv" / "python")
    flops = run_bench(tmp_path, "--dtype", "int8", "--naive-iters", "0")["flops"]
    peak = flops["int8_peak"]
    assert peak["peak"] == max(peak["x86"], peak.get("onednn", 0.0)) > 0 and peak["threads"] == 1
    assert ("bfloat16" in peak) == int8_linear.native_bfloat16()
    assert flops["ours_fraction_of_int8_peak"] == pytest.approx(flops["ours_fraction"] * flops["peak_gflops"]
                                                                / peak["peak"])
    assert 0 < flops["ours_fraction_of_int8_peak"] < 1
    assert "% of the int8 peak" in capsys.readouterr().out
    assert torch.backends.quantized.engine == int8_linear.ENGINE      # the model's engine is left in place


@pytest.mark.slow
@pytest.mark.skipif(not cli.LEROBOT_PYTHON.exists(), reason="no .venv-lerobot (make lerobot-env)")
def test_bench_against_lerobot(tmp_path):
    r = run_bench(tmp_path, "--naive-iters", "0")
    lr = r["lerobot"]
    assert lr["available"] and lr["n"] == 2 and lr["speedup"] > 0
    assert lr["rounds"] == 2                          # --iters 2: two blocks of one chunk each, alternating
    assert lr["max_abs_diff"] < 1e-5                  # same weights, inputs and noise as LeRobot
    # LeRobot's whole path from the raw observation (its saved processors) gives the same actions.
    assert lr["pipeline_max_abs_diff"] < 1e-5 and lr["pipeline"]["n"] == 2 and lr["pipeline_speedup"] > 0
    assert lr["pipeline"]["median_ms"] >= lr["median_ms"]
    assert lr["not_in_checkpoint"] == ["model.vlm_with_expert.vlm.lm_head.weight",
                                       "model.vlm_with_expert.vlm.model.text_model.norm.weight"]
    assert r["naive"] is None


def test_matrix_row_reads_two_bench_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "LEROBOT_PYTHON", tmp_path / "no-venv" / "python")
    eager = {**run_bench(tmp_path), "load_average": 0.5}
    faster = json.loads(json.dumps(eager))
    faster["stages"]["total"]["median_ms"] = eager["stages"]["total"]["median_ms"] / 2
    faster["lerobot"] = eager["lerobot"] = {"available": True, "pipeline": {"median_ms": 40.0},
                                            "pipeline_speedup": 3.5, "pipeline_max_abs_diff": 2e-7}
    cells = [c.strip() for c in matrix.row(eager, faster).strip("|").split("|")]
    assert len(cells) == len(matrix.HEADER.splitlines()[0].strip("|").split("|"))
    used = eager["config"]["prompt_tokens_used"]
    assert cells[:4] == ["1", "1", "1", f"max_length (48, eager {used})"] and cells[6] == "2.00x"
    assert cells[7:11] == ["40.0", "3.50x", "**3.50x**", "2.0e-07"]
    eager["lerobot"] = {"available": False}
    assert "not measured" in matrix.row(eager, faster)


def test_dds_mode_passes_compile_to_the_node(tmp_path):
    """--dds --compile measures the node with compile: true, through a params file the node's parser accepts."""
    from vla_policy_node.bench import dds
    from vla_policy_node.ros.params import PARAMETERS

    path = tmp_path / "params.yaml"
    dds.write_params(path, tmp_path, ["front"], "float32", 1, 100.0, compile_policy=True)
    params = yaml.safe_load(path.read_text())["/**"]["ros__parameters"]
    assert params["compile"] is True and params["num_threads"] == 1
    assert "compile" in {spec.name for spec in PARAMETERS}
    # The probe's joints stand still: with the default tracking check the node latched a stop and sent nothing.
    assert params["limits"]["max_tracking_error"] == [0.0]


def test_bench_traces_as_the_node_does(tmp_path, monkeypatch, capsys):
    """--trace: the warm-up traces each prompt length bucket and the timed chunks replay them."""
    monkeypatch.setattr(cli, "LEROBOT_PYTHON", tmp_path / "no-venv" / "python")
    r = run_bench(tmp_path, "--trace", "--naive-iters", "0")
    assert r["config"]["traced"] == 3 and r["config"]["trace_report"] == ""
    assert "eager chunks replayed from 3 traces (--trace)" in capsys.readouterr().out
    assert r["stages"]["total"]["n"] == 2


def test_traced_pair_alternates_traced_and_python_chunks(tmp_path):
    from benchmarks import traced_pair
    out = tmp_path / "pair.json"
    assert traced_pair.main(["tiny", "--dtype", "float32", "--threads", "1", "--rounds", "2", "--beside",
                             "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["traces"] == 3 and r["max_action_diff_relative"] < 1e-5
    for case in ("alone", "beside"):
        assert r[case]["traced_median_ms"] > 0 and r[case]["python_median_ms"] > 0


def test_bench_batch_and_longest_padding(tmp_path, monkeypatch):
    """--batch stacks rows with prompts of different lengths; --padding longest pads them to the longest only."""
    monkeypatch.setattr(cli, "LEROBOT_PYTHON", tmp_path / "no-venv" / "python")
    r = run_bench(tmp_path, "--batch", "3", "--padding", "longest", "--cameras", "2", "--naive-iters", "0")
    c = r["config"]
    assert (c["batch"], c["padding"], c["cameras"]) == (3, "longest", 2)
    assert 0 < c["prompt_tokens"] < 48                                     # max_length would be 48
    assert c["prefix_tokens"] == 2 * (64 // 8) ** 2 // 2 ** 2 + c["prompt_tokens"] + 1
    assert r["step_bytes"]["weights"] > 0 and r["step_bytes"]["kv_cache"] > 0
    assert r["stages"]["total"]["n"] == 2


def test_step_bytes_counts_every_weight_the_step_multiplies_by_once(tmp_path):
    """
    Count the GPU check's floor: fused q/k/v and gate/up once.

    Fused weights are buffers the covered linears share; cross-attention k/v (projected once
    per prefix) and the VLM (read only for ``.dtype``) are not counted.
    """
    folder = checkpoints.save_random_checkpoint(tmp_path / "ck", "tiny", 1)
    policy = load_policy(folder, device="cpu", dtype="float32")
    obs, noise = cli.make_observation(policy, (48, 64), 0, 1)
    inputs = lerobot_compare.worker_inputs(policy, obs, noise, tmp_path / "inputs.safetensors")
    model = policy.model

    def nbytes(module, skip=()):
        return sum(p.numel() * p.element_size() for name, p in module.named_parameters() if not name.startswith(skip))
    expected = sum(nbytes(layer, ("self_attn.k_proj", "self_attn.v_proj") if layer.self_attn.cross else ())
                   for layer in model.expert_layers)
    expected += sum(nbytes(getattr(model, name)) for name in ("action_in_proj", "action_time_mlp_out", "expert_norm",
                                                              "action_out_proj"))
    # The time MLP's bias is in the per-step time constant (``blocks.time_half``); its weight's
    # storage counts whole, though the step multiplies only the action half of it.
    expected += nbytes(model.action_time_mlp_in, ("bias",))
    assert any(layer.mlp.gate_up_weight is not None for layer in model.expert_layers)     # fused: the case at stake
    counted = cli.step_bytes(policy, inputs, torch.from_numpy(noise))
    assert counted["weights"] == expected
    assert counted["kv_cache"] > 0


def test_batch_cost_times_each_batch_size():
    """--batch-cost: one row per batch size, per-robot cost the batch's over its rows (eager here)."""
    from benchmarks.remote import batch_cost

    rows = batch_cost('tiny', [1, 3], iters=2, threads=1)
    assert [r['batch'] for r in rows] == [1, 3]
    for row in rows:
        assert row['median_ms'] > 0 and row['per_robot_ms'] == pytest.approx(row['median_ms'] / row['batch'])
        assert 'built_median_ms' not in row


def test_a_checkpoint_that_is_not_there_is_one_line_not_a_traceback(capsys):
    assert cli.main(["--checkpoint", "/nonexistent/ckpt", "--no-lerobot"]) == 2
    err = capsys.readouterr().err
    assert "vla-policy-bench: not run: checkpoint folder /nonexistent/ckpt does not exist" in err
    assert "Traceback" not in err


@pytest.mark.parametrize('module, shown', [
    ('vla_policy_node.bench.cli', '--iters ITERS         timed chunks (per round) (default: 20)'),
    ('vla_policy_node.train.cli', '--steps STEPS         optimizer steps (default: 6000)'),
    ('vla_policy_node.ros.sim.evaluation', '--episodes EPISODES   episodes per mode, each a new layout (default: 20)'),
    ('vla_policy_node.replay.record', '--duration DURATION   seconds to record; 0: until Ctrl-C (default: 0.0)'),
])
def test_help_describes_every_option_with_its_default(module, shown, capsys):
    """Help text shows a default only for an option that has a description: every option but -h has both."""
    import importlib
    with pytest.raises(SystemExit):
        importlib.import_module(module).main(['--help'])
    out = capsys.readouterr().out
    assert ' '.join(shown.split()) in ' '.join(out.split()), out
    options = out.split('options:')[1]
    described = ' '.join(options.split()).count('(default: ')
    assert described == options.count('\n  -') - 1, out           # all but -h/--help
