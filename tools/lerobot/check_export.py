# SPDX-License-Identifier: Apache-2.0
"""LeRobot 0.6.1 reads a dataset exported by ``vla-policy-replay BAG --export-dataset`` and trains on it.

    .venv-lerobot061/bin/python tools/lerobot/check_export.py DATASET [--policy EXPORTED_SMOLVLA] [--steps 3]

(``make lerobot-export-check`` makes DATASET from a synthetic bag and POLICY from the shipped SO-101 policy.)

1. ``LeRobotDataset("local/<name>", root=DATASET, video_backend="pyav")`` opens it; every item's state, action,
   timestamp, task and camera frames are compared with the project's reader (``vla_policy_node.dataset``, which
   needs only numpy, pyarrow, PyAV and Pillow, all in this venv): equal, frames bit for bit.
2. ``lerobot-train --policy.path=. --dataset.root=DATASET --steps N`` runs from inside the policy folder
   (an export names its backbone with the relative folder ``vlm``), offline, on the CPU.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402


def compare(root: Path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from vla_policy_node.dataset.reader import Dataset

    lerobot = LeRobotDataset(f"local/{root.name}", root=root, video_backend="pyav")
    ours = Dataset(root)
    episodes = {e.index: ours.episode(e.index) for e in ours.episodes}
    worst = 0
    for i in range(len(lerobot)):
        item = lerobot[i]
        episode, frame = episodes[int(item["episode_index"])], int(item["frame_index"])
        assert np.array_equal(item["observation.state"].numpy(), episode.states[frame]), i
        assert np.array_equal(item["action"].numpy(), episode.actions[frame]), i
        assert float(item["timestamp"]) == float(episode.timestamps[frame]) and item["task"] == episode.tasks[frame], i
        for key in lerobot.meta.camera_keys:
            theirs = np.round(item[key].numpy().transpose(1, 2, 0) * 255).astype(int)
            mine = episode.frames[key.removeprefix("observation.images.")][frame]
            worst = max(worst, int(np.abs(theirs - mine).max()))
    print(f"LeRobot {__import__('lerobot').__version__} opened {root}: {len(lerobot)} frames, "
          f"{lerobot.meta.total_episodes} episodes, tasks {list(lerobot.meta.tasks.index)}, cameras "
          f"{lerobot.meta.camera_keys}, fps {lerobot.fps}, robot {lerobot.meta.robot_type}; states, actions, "
          f"timestamps and tasks equal to the project's reader; frames: max |difference| {worst}")
    assert worst == 0


def train(root: Path, policy: Path, steps: int, output: Path) -> None:
    command = [str(Path(sys.executable).parent / "lerobot-train"), "--policy.path=.",
               f"--dataset.repo_id=local/{root.name}",
               f"--dataset.root={root}", "--dataset.video_backend=pyav", f"--steps={steps}", "--batch_size=2",
               "--num_workers=0", "--save_checkpoint=false", "--policy.device=cpu", "--policy.push_to_hub=false",
               "--wandb.enable=false", f"--output_dir={output}", "--log_freq=1"]
    result = subprocess.run(command, cwd=policy, capture_output=True, text=True, env={**os.environ, "SVT_LOG": "1"})
    lines = [line for line in (result.stdout + result.stderr).splitlines() if " step:" in line or "End of" in line]
    for line in lines:
        print(line.split("ot_train.py:")[-1].strip())
    if result.returncode != 0:
        print((result.stdout + result.stderr)[-3000:])
        raise SystemExit(f"lerobot-train failed ({result.returncode})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--policy", type=Path, help="a SmolVLA exported for LeRobot 0.6 (vla-policy-train)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--output", type=Path, default=Path("/tmp/lerobot-export-check-train"))
    args = parser.parse_args()
    compare(args.dataset.resolve())
    if args.policy is not None:
        train(args.dataset.resolve(), args.policy.resolve(), args.steps, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
