# SPDX-License-Identifier: Apache-2.0
"""
The LeRobot side of the bench: its environment, why it cannot run, its worker process, its inputs.

LeRobot 0.4.4 runs from ``.venv-lerobot`` as a subprocess (``lerobot_worker.py``), one request
per line; ``worker_inputs`` saves the observation the bench feeds both sides.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from safetensors.torch import save_file

from vla_policy_node.bench.memory import WORKING_BYTES
from vla_policy_node.bench.measure import available_memory_bytes
from vla_policy_node.loading.checkpoint import CheckpointError, read_safetensors_header
from vla_policy_node.runtime.policy import Policy
from vla_policy_node.model.types import ModelInputs

REPO = Path(__file__).resolve().parents[2]
# LeRobot's own environment (``make lerobot-env``); VLA_BENCH_LEROBOT_PYTHON points at another one.
LEROBOT_PYTHON = Path(os.environ.get("VLA_BENCH_LEROBOT_PYTHON", REPO / ".venv-lerobot" / "bin" / "python"))
WORKER = Path(__file__).with_name("lerobot_worker.py")


def lerobot_pi_blocker(python: Optional[Path] = None) -> Optional[str]:
    """Why LeRobot 0.4.4's pi0 / pi0.5 cannot run from ``python`` (``LEROBOT_PYTHON``; found in a second), or None."""
    python = python or LEROBOT_PYTHON
    probe = ("import importlib.util, transformers; print(transformers.__version__, "
             "importlib.util.find_spec('transformers.models.siglip.check') is not None)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""}
    try:
        out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not probe {python} for transformers: {exc}"
    words = out.stdout.split()
    if out.returncode != 0 or len(words) < 2:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return f"could not import transformers in {python}: {tail}"
    if words[-1] == "True":
        return None
    return (f"LeRobot 0.4.4's pi0/pi0.5 need openpi's patched transformers (modeling_pi0 imports "
            f"transformers.models.siglip.check, else raises 'An incorrect transformer version is used'); "
            f".venv-lerobot has transformers {words[-2]} without it")


def lerobot_memory_blocker(folder: Path) -> Optional[str]:
    """Say why LeRobot's float32 copy of the checkpoint would not fit in RAM beside our policy, or None."""
    try:
        params = sum(info.numel for info in read_safetensors_header(folder / "model.safetensors").values())
    except (CheckpointError, OSError):
        return None                     # not a single-file checkpoint: let the worker report
    need, available = params * 4 + WORKING_BYTES, available_memory_bytes()
    if need <= available:
        return None
    return (f"LeRobot would load {params / 1e9:.2f} B parameters in float32 ({need / 2**30:.1f} GiB with its working "
            f"memory) beside this policy; {available / 2**30:.1f} GiB is available")


class LeRobotWorker:
    """LeRobot's ``predict_action_chunk`` in its own virtual environment, one request per line."""

    def __init__(self, checkpoint: Path, inputs: Path, threads: int, log: Path,
                 python: Optional[Path] = None) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""}
        self.log = log
        with open(log, "w") as stderr:
            self.proc = subprocess.Popen(
                [str(python or LEROBOT_PYTHON), str(WORKER), str(checkpoint), str(inputs), "--threads", str(threads)],
                cwd=checkpoint, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True)
        self.info = self._reply()

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"the LeRobot worker exited (code {self.proc.wait()}): {' | '.join(tail)}")
        return json.loads(line)

    def request(self, line: str) -> dict:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)


def worker_inputs(policy: Policy, obs: dict, noise: np.ndarray, path: Path) -> ModelInputs:
    """
    Save the same observation for LeRobot, raw and as its model takes it.

    ``raw.*`` (with the tasks in the metadata) feeds its whole path, ``batch.*`` its
    ``predict_action_chunk`` as its pre-processor would leave it.
    """
    inputs = policy.preprocessor(obs)

    def frames(arr: np.ndarray) -> torch.Tensor:            # (B, 3, H, W) float in [0, 1]
        arr = arr if arr.ndim == 4 else arr[None]
        return torch.from_numpy(arr).permute(0, 3, 1, 2).float().div(255.0).contiguous()
    images = {name: frames(obs["images"][name]) for name in policy.camera_names}
    tensors = {f"{kind}.{name}": t.clone() for kind in ("batch", "raw") for name, t in images.items()}
    state = np.asarray(obs["state"], np.float32)
    state = state if state.ndim == 2 else state[None]
    tensors["raw.observation.state"] = torch.from_numpy(np.ascontiguousarray(state))
    normalized = policy.preprocessor.state_normalizer.normalize(state)
    tensors["batch.observation.state"] = torch.from_numpy(np.ascontiguousarray(normalized, dtype=np.float32))
    tensors["batch.observation.language.tokens"] = inputs.tokens
    tensors["batch.observation.language.attention_mask"] = inputs.token_mask
    tensors["noise"] = torch.from_numpy(noise)
    tasks = [obs["task"]] if isinstance(obs["task"], str) else list(obs["task"])
    save_file(tensors, str(path), metadata={"tasks": json.dumps(tasks)})
    return inputs
