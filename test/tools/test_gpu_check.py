# SPDX-License-Identifier: Apache-2.0
"""``make gpu-check``: its goal table and bandwidth floor (checked on the CPU), and a clear stop without CUDA."""

import json
import subprocess

import pytest
import torch

from benchmarks import gpu_check


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


def test_the_six_runs_of_the_check_goal_runs_first():
    names = [r.name for r in gpu_check.runs()]
    assert len(names) == 6 and len(set(names)) == 6
    assert sum("CUDA graphs" in n for n in names) == 4 and sum(n.startswith("pi0") for n in names) == 2
    assert names[:2] == ["smolvla bfloat16, CUDA graphs", "pi0 bfloat16, CUDA graphs, 1 camera"]


def test_a_budget_cut_leaves_a_table_and_no_run_is_refused_for_host_ram(tmp_path, monkeypatch, capsys):
    """
    Keep to the budget as on a lent GPU machine, and still print the table.

    Tests that hang are stopped at a third of the budget, every bench run skips the host-RAM
    check, a run past the budget is stopped and the ones after it are skipped.
    """
    clock = [0.0]
    commands = []

    def fake_run(command, cwd, env, timeout):
        commands.append(command)
        if "pytest" in command or timeout < 120:        # hangs, or would take 120 s
            clock[0] += timeout
            raise subprocess.TimeoutExpired(command, timeout)
        clock[0] += 120
        with open(command[command.index("--json") + 1], "w") as f:
            json.dump(result("smolvla", "bfloat16", True, 1, 2.0, 0.05, 4.0, 240e6, 0), f)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    monkeypatch.setattr(gpu_check.time, "perf_counter", lambda: clock[0])
    assert gpu_check.main(["--out", str(tmp_path), "--budget", "300"]) == 1
    out = capsys.readouterr()
    assert "CUDA tests: stopped after 100 s, a third of the budget" in out.out
    bench = commands[1:]
    assert len(bench) == 2 and all("--no-memory-check" in c and "cuda" in c for c in bench)
    assert "| smolvla bfloat16, CUDA graphs | 2.00 |" in out.out
    assert out.out.count("**not run**") == 5
    assert "pi0 bfloat16, CUDA graphs, 1 camera: stopped at the 300 s budget" in out.err
    assert out.err.count("skipped, the 300 s budget is spent") == 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_without_cuda_it_stops_with_the_reason(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and "GPU_PYTHON=" in err


def test_a_budget_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--budget", "0"])
    assert "--budget" in capsys.readouterr().err
