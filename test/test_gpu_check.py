# SPDX-License-Identifier: Apache-2.0
"""``make gpu-check``: its goal table and bandwidth floor (checked on the CPU), and a clear stop without CUDA."""

import pytest
import torch

from vla_policy_node.bench import gpu_check


def result(family, dtype, graphs, cameras, prefix, step, total, weights, kv):
    stage = {"prefix": prefix, "denoise_step": step, "total": total}
    return {"config": {"family": family, "dtype": dtype, "cuda_graphs": graphs, "cameras": cameras},
            "stages": {k: {"median_ms": v} for k, v in stage.items()},
            "step_bytes": {"weights": weights, "kv_cache": kv}}


def test_floor_is_bytes_over_bandwidth():
    assert gpu_check.floor_ms({"weights": 4.8e9, "kv_cache": 0}, 4800.0) == pytest.approx(1.0)
    assert gpu_check.floor_ms({"weights": 1e9, "kv_cache": 1e9}, 1000.0) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="bandwidth"):
        gpu_check.floor_ms({"weights": 1, "kv_cache": 0}, 0.0)


def test_peak_bandwidth_takes_the_most_specific_name():
    assert gpu_check.peak_bandwidth_gbs("NVIDIA H200") == 4800.0
    assert gpu_check.peak_bandwidth_gbs("NVIDIA H100 PCIe") == 2000.0
    assert gpu_check.peak_bandwidth_gbs("NVIDIA H100 80GB HBM3") == 3350.0
    assert gpu_check.peak_bandwidth_gbs("Some Future GPU") is None


def test_goal_table_marks_each_goal_and_missing_runs():
    results = {
        "smolvla bfloat16, CUDA graphs": result("smolvla", "bfloat16", True, 1, 2.0, 0.20, 4.5, 240e6, 10e6),
        "smolvla float32": result("smolvla", "float32", False, 1, 3.0, 0.40, 7.0, 480e6, 20e6),
        "pi0 bfloat16, CUDA graphs, 1 camera": result("pi0", "bfloat16", True, 1, 8.0, 0.30, 16.0, 600e6, 30e6),
        "pi0 bfloat16, CUDA graphs, 3 cameras": None,
    }
    text = gpu_check.table(results, "NVIDIA H200", 4800.0, "data sheet")
    lines = text.splitlines()
    assert "4800 GB/s (data sheet)" in lines[0]
    assert "| SmolVLA chunk <= 5 ms (4.50 vs 5.00) | met |" in text
    # floor of the SmolVLA bf16 step: 250 MB / 4.8 TB/s = 0.052 ms; 0.20 ms is more than 2x of it
    assert "denoise step <= 2x bandwidth floor (0.20 vs 0.10) | **missed** |" in text
    assert "| pi0, 1 camera, chunk <= 15 ms (16.00 vs 15.00) | **missed** |" in text
    assert "| pi0 bfloat16, CUDA graphs, 3 cameras | | | | | | **not run** |" in text
    assert "SmolVLA chunk" not in "\n".join(line for line in lines if line.startswith("| smolvla float32"))
    assert lines[-1].startswith("some goals missed")


def test_all_goals_met_is_said_once_everything_passes():
    ok = {"s": result("smolvla", "bfloat16", True, 1, 2.0, 0.05, 4.0, 240e6, 0)}
    assert gpu_check.table(ok, "NVIDIA H200", 4800.0, "data sheet").splitlines()[-1] == "all goals met"


def test_the_six_runs_of_the_check():
    names = [r.name for r in gpu_check.runs()]
    assert len(names) == 6 and len(set(names)) == 6
    assert sum("CUDA graphs" in n for n in names) == 4 and sum(n.startswith("pi0") for n in names) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_without_cuda_it_stops_with_the_reason(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path)]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
