# SPDX-License-Identifier: Apache-2.0
"""Write small LeRobotDataset v3.0 fixtures with LeRobot 0.6.1 itself, and what LeRobot reads back from them.

    .venv-lerobot061/bin/python tools/lerobot/make_dataset_fixtures.py [OUT]     # make lerobot-fixtures

OUT defaults to test/fixtures/lerobot061/datasets. Each dataset is made with ``LeRobotDataset.create`` +
``add_frame`` / ``save_episode`` / ``finalize`` (LeRobot's own writer, as ``lerobot-record`` uses it):

- ``video_av1``: three cameras ``top``, ``wrist``, ``side`` (24x32 RGB) as videos in LeRobot's default codec
  (libsvtav1, yuv420p, g=2, crf=30), five episodes, two tasks;
- ``video_h264``: the same frames with ``vcodec="h264"``;
- ``images``: two cameras ``top``, ``wrist`` stored as PNG images (``use_videos=False``), four episodes, two tasks.

Then each dataset is reopened with ``LeRobotDataset(repo_id, root=..., video_backend="pyav")`` in this process
and every item LeRobot returns is written to ``<dataset>.expected.json`` beside it: index, episode, frame index,
timestamp, task, state and action (float32 values as Python floats), and per camera the SHA-256 of the frame as
uint8 (H, W, 3) (LeRobot's float frame * 255, rounded: LeRobot divides the decoded uint8 by 255). The
project's reader tests (test/replay/test_lerobot_dataset.py) compare with these without LeRobot.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from lerobot.configs.video import VideoEncoderConfig  # noqa: E402
from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402

HEIGHT, WIDTH = 24, 32
FPS = 10
JOINTS = ["shoulder_pan.pos", "shoulder_lift.pos", "elbow_flex.pos", "wrist_flex.pos", "wrist_roll.pos",
          "gripper.pos"]
TASKS = ["pick up the red cube", "push the blue block to the left"]


def features(cameras: list[str], kind: str) -> dict:
    """The features as lerobot-record declares an SO-101's (degrees; gripper 0-100)."""
    out = {name: {"dtype": "float32", "shape": (len(JOINTS),), "names": JOINTS}
           for name in ("observation.state", "action")}
    for camera in cameras:
        out[f"observation.images.{camera}"] = {"dtype": kind, "shape": (HEIGHT, WIDTH, 3),
                                               "names": ["height", "width", "channels"]}
    return out


def frame_image(episode: int, frame: int, camera: int) -> np.ndarray:
    """A smooth gradient with a moving square: compressible, and every frame differs."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    image = np.stack([(x * 7 + episode * 40) % 256, (y * 9 + camera * 80) % 256,
                      np.full_like(x, (frame * 11) % 256)], axis=-1).astype(np.uint8)
    top, left = (frame * 2 + camera * 3) % (HEIGHT - 6), (frame * 3 + episode * 5) % (WIDTH - 6)
    image[top:top + 6, left:left + 6] = (255, 255 - 40 * camera, 40 * episode % 256)
    return image


def write(root: Path, repo_id: str, cameras: list[str], kind: str, lengths: list[int], **create) -> None:
    rng = np.random.default_rng(len(lengths) * 100 + len(cameras))
    dataset = LeRobotDataset.create(repo_id, FPS, features(cameras, kind), root=root, robot_type="so101_follower",
                                    use_videos=kind == "video", **create)
    for episode, length in enumerate(lengths):
        start = rng.uniform(-60, 60, len(JOINTS)).astype(np.float32)
        start[-1] = rng.uniform(0, 100)
        for frame in range(length):
            state = start + np.float32(5.0) * np.sin(np.float32(0.3) * frame + np.arange(len(JOINTS), dtype=np.float32))
            action = state + rng.normal(0, 1.5, len(JOINTS)).astype(np.float32)
            item = {"observation.state": state.astype(np.float32), "action": action.astype(np.float32),
                    "task": TASKS[episode % 2]}
            for c, camera in enumerate(cameras):
                item[f"observation.images.{camera}"] = frame_image(episode, frame, c)
            dataset.add_frame(item)
        dataset.save_episode()
    dataset.finalize()


def frame_sha(value: torch.Tensor) -> str:
    """SHA-256 of a LeRobot frame (C, H, W) as uint8 (H, W, C)."""
    array = value.numpy()
    if array.dtype != np.uint8:
        array = np.round(array * 255.0).astype(np.uint8)
    return hashlib.sha256(np.ascontiguousarray(array.transpose(1, 2, 0)).tobytes()).hexdigest()


def expected(root: Path, repo_id: str) -> dict:
    """Every item as LeRobot 0.6.1 reads it."""
    dataset = LeRobotDataset(repo_id, root=root, video_backend="pyav")
    cameras = dataset.meta.camera_keys
    items = []
    for i in range(len(dataset)):
        item = dataset[i]
        items.append({
            "index": int(item["index"]), "episode_index": int(item["episode_index"]),
            "frame_index": int(item["frame_index"]), "timestamp": float(item["timestamp"]),
            "task_index": int(item["task_index"]), "task": item["task"],
            "observation.state": [float(v) for v in item["observation.state"]],
            "action": [float(v) for v in item["action"]],
            "frames": {key: frame_sha(item[key]) for key in cameras}})
    return {"lerobot": "0.6.1", "repo_id": repo_id, "fps": dataset.fps, "robot_type": dataset.meta.robot_type,
            "total_episodes": dataset.meta.total_episodes, "total_frames": dataset.meta.total_frames,
            "cameras": cameras, "video_keys": dataset.meta.video_keys,
            "tasks": {int(i): t for t, i in zip(dataset.meta.tasks.index, dataset.meta.tasks["task_index"])},
            "items": items}


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
               / "test/fixtures/lerobot061/datasets")
    out.mkdir(parents=True, exist_ok=True)
    specs = {
        "video_av1": (["top", "wrist", "side"], "video", [12, 9, 14, 10, 11], {}),
        "video_h264": (["top", "wrist", "side"], "video", [12, 9, 14, 10, 11],
                       {"rgb_encoder": VideoEncoderConfig(vcodec="h264")}),
        "images": (["top", "wrist"], "image", [8, 11, 9, 10], {}),
    }
    for name, (cameras, kind, lengths, create) in specs.items():
        root = out / name
        shutil.rmtree(root, ignore_errors=True)
        repo_id = f"vla_policy_node/{name}"
        write(root, repo_id, cameras, kind, lengths, **create)
        values = expected(root, repo_id)
        (out / f"{name}.expected.json").write_text(json.dumps(values, indent=1) + "\n")
        size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        print(f"{name}: {values['total_episodes']} episodes, {values['total_frames']} frames, {size // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
