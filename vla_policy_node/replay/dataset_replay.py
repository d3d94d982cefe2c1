# SPDX-License-Identifier: Apache-2.0
r"""
vla-policy-replay --dataset: the policy run open loop over a LeRobotDataset's episodes, as the node runs it.

    vla-policy-replay --dataset ~/.cache/huggingface/lerobot/me/so101_pick --params-file config/so101.yaml \\
        -p checkpoint:=outputs/train/run/checkpoints/last/pretrained_model --episodes 0 3 --json r.json

The dataset's features map onto the node's inputs: ``observation.images.<name>`` feeds the camera
``<name>`` of ``camera_names``, ``observation.state`` and ``action`` are in the dataset's units, which
are the policy's units of ``joint_units`` (``policy = (ros - offset) * scale``): the state goes to the
policy as the node hands it over after mapping ``/joint_states``, and ``joint_units`` maps the actions
to radians as the node does before commanding. At each episode's start the policy is reset (the
node's episode boundary); every ``period`` frames (default: one horizon) it gets that frame's
observation, and the first ``horizon`` rows of its chunk predict the actions of the next frames, one
row per frame (the node's ``control_rate_hz`` must be the dataset's fps). Errors are reported per
joint in the dataset's units and in ROS units (radians), per episode and overall.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
import json
import math
from pathlib import Path
import time
from typing import Any

import numpy as np

from vla_policy_node.dataset.reader import ACTION, Dataset, DatasetError, IMAGE_PREFIX, STATE


@dataclass
class EpisodeReplay:
    """One episode's predictions against its recorded actions (dataset units)."""

    index: int
    task: str
    rows_frame: np.ndarray          # (M,) the frame each predicted row is compared with
    predicted: np.ndarray           # (M, J) dataset units
    recorded: np.ndarray            # (N, J) the episode's actions
    latencies: list[float]

    @property
    def errors(self) -> np.ndarray:
        """Return predicted - recorded (M, J), dataset units."""
        return self.predicted - self.recorded[self.rows_frame]


def _joint_errors(names: Sequence[str], errors: np.ndarray, scale: np.ndarray) -> dict[str, Any]:
    """Per joint: MAE, RMSE, largest error in dataset units and radians (ROS units), and the points."""
    out = {}
    for j, name in enumerate(names):
        error = errors[:, j]
        row = {'points': int(error.size)}
        for unit, values in (('', error), ('_ros', error / scale[j])):
            row[f'mae{unit}'] = float(np.mean(np.abs(values))) if values.size else math.nan
            row[f'rmse{unit}'] = float(np.sqrt(np.mean(values ** 2))) if values.size else math.nan
            row[f'max_abs{unit}'] = float(np.max(np.abs(values))) if values.size else math.nan
        out[name] = row
    return out


@dataclass
class DatasetReplay:
    """What a dataset replay produced, episode by episode."""

    source: str
    fps: float
    joint_names: tuple[str, ...]
    joint_map: Any                  # control.joint_map.JointMap: dataset (policy) units <-> ROS units
    episodes: list[EpisodeReplay]

    def summary(self) -> dict[str, Any]:
        """Per joint errors (dataset units; ``_ros``: radians), per episode and overall."""
        scale = np.asarray(self.joint_map.scale)
        latency = np.array([s for e in self.episodes for s in e.latencies]) * 1e3
        every = np.concatenate([e.errors for e in self.episodes]) if self.episodes else np.zeros((0, len(scale)))
        return {
            'dataset': self.source, 'fps': self.fps, 'units': 'dataset units; *_ros: ROS units (radians)',
            'joints': _joint_errors(self.joint_names, every, scale),
            'chunks': sum(len(e.latencies) for e in self.episodes), 'predicted_points': int(len(every)),
            'inference_ms_p50': float(np.median(latency)) if latency.size else math.nan,
            'episodes': {str(e.index): {'task': e.task, 'frames': int(len(e.recorded)), 'chunks': len(e.latencies),
                                        'joints': _joint_errors(self.joint_names, e.errors, scale)}
                         for e in self.episodes}}

    def as_bag_replay(self) -> Any:
        """Return the episodes end to end in ROS units as a bag replay's result (for its plot)."""
        from vla_policy_node.replay.bag_replay import Replay
        offsets = np.cumsum([0] + [len(e.recorded) for e in self.episodes])
        rows = np.concatenate([offset + e.rows_frame for offset, e in zip(offsets, self.episodes)])
        predicted = self.joint_map.action_to_ros(np.concatenate([e.predicted for e in self.episodes]))
        recorded = self.joint_map.action_to_ros(np.concatenate([e.recorded for e in self.episodes]))
        return Replay(self.joint_names, rows / self.fps, predicted, np.arange(len(recorded)) / self.fps, recorded,
                      predicted - recorded[rows], chunks=sum(len(e.latencies) for e in self.episodes),
                      inference_seconds=[s for e in self.episodes for s in e.latencies])


def check_fit(dataset: Dataset, settings: Any) -> None:
    """Refuse (DatasetError, one line naming the feature) a dataset the node's settings cannot replay."""
    missing = [name for name in settings.camera_names if name not in dataset.cameras]
    if missing:
        raise DatasetError(f'camera_names {missing}: no feature {[IMAGE_PREFIX + m for m in missing]} in the '
                           f'dataset (its cameras: {dataset.cameras})')
    joints = len(settings.joint_names)
    for key in (STATE, ACTION):
        size = int(np.prod(dataset.features[key]['shape']))
        if size != joints:
            raise DatasetError(f'{key} has {size} values per frame ({dataset.names(key)}), joint_names '
                               f'{joints} joints')
    names = [name.removesuffix('.pos') for name in dataset.names(STATE)]
    if sorted(names) == sorted(settings.joint_names) and names != list(settings.joint_names):
        raise DatasetError(f'{STATE} names the joints in the order {names}, joint_names in the order '
                           f'{list(settings.joint_names)}: reorder joint_names as the dataset')
    if not math.isclose(dataset.fps, settings.control_rate_hz, rel_tol=1e-6):
        raise DatasetError(f'the dataset is at {dataset.fps:g} fps but control_rate_hz is '
                           f'{settings.control_rate_hz:g}: the chunk rows would be compared at the wrong frames '
                           f'(-p control_rate_hz:={dataset.fps:g})')


def check_episodes(dataset: Dataset, episodes: Sequence[int] | None) -> list[int]:
    """Return the episodes to replay (default: all); DatasetError naming one the dataset lacks."""
    present = [e.index for e in dataset.episodes]
    unknown = sorted(set(episodes or ()) - set(present))
    if unknown:
        raise DatasetError(f'{dataset.root}: no episode(s) {unknown} (it has {present[0]}..{present[-1]})')
    return present if episodes is None else list(episodes)


def replay_dataset(dataset: Dataset, settings: Any, policy: Any, episodes: Sequence[int] | None = None,
                   period: int | None = None) -> DatasetReplay:
    """Run ``policy`` open loop over ``episodes`` (default: all) of ``dataset``; ``period`` in frames."""
    check_fit(dataset, settings)
    horizon = settings.horizon or policy.chunk_size
    period = period or horizon
    wanted = check_episodes(dataset, episodes)
    return DatasetReplay(str(dataset.root), dataset.fps, tuple(settings.joint_names), settings.joint_map,
                         [_replay_episode(dataset, index, settings, policy, horizon, period) for index in wanted])


def _replay_episode(dataset: Dataset, index: int, settings: Any, policy: Any, horizon: int,
                    period: int) -> EpisodeReplay:
    length = next(e.length for e in dataset.episodes if e.index == index)
    data = dataset.episode(index, list(range(0, length, period)))      # the frames the policy sees
    frames = len(data.timestamps)
    reset = getattr(policy, 'reset', None)
    if reset is not None:
        reset()
    rows_frame, predicted, latencies = [], [], []
    for j, t in enumerate(range(0, frames, period)):
        observation = {'images': {name: data.frames[name][j] for name in settings.camera_names},
                       'state': data.states[t], 'task': data.tasks[t]}
        started = time.perf_counter()
        chunk = np.asarray(policy.predict_action_chunk(observation), dtype=np.float64)[0]
        latencies.append(time.perf_counter() - started)
        rows = chunk[:min(horizon, frames - t)]
        rows_frame.extend(range(t, t + len(rows)))
        predicted.extend(rows)
    predicted_rows = np.asarray(predicted).reshape(-1, data.actions.shape[1])
    return EpisodeReplay(index, data.tasks[0], np.asarray(rows_frame), predicted_rows, data.actions.astype(np.float64),
                         latencies)


def report(result: DatasetReplay, json_path: str | None, plot_path: str | None) -> None:
    """Print the per-joint table (dataset units and radians), per episode and overall; write JSON and plot."""
    summary = result.summary()
    width = max(len(name) for name in result.joint_names)
    print(f"{result.source}: {len(result.episodes)} episodes, {summary['chunks']} chunks, "
          f"{summary['predicted_points']} predicted points at {result.fps:g} fps, inference p50 "
          f"{summary['inference_ms_p50']:.1f} ms")
    sections = [(f"episode {i} ({e['task']!r}, {e['frames']} frames)", e['joints'])
                for i, e in summary['episodes'].items()] + [('all episodes', summary['joints'])]
    for title, joints in sections:
        print(f"{title}\n{'joint':<{width}}  {'MAE':>10}  {'RMSE':>10}  {'max':>10}  {'MAE rad':>10}  "
              f"{'max rad':>10}  points")
        for name, row in joints.items():
            print(f"{name:<{width}}  {row['mae']:>10.5f}  {row['rmse']:>10.5f}  {row['max_abs']:>10.5f}  "
                  f"{row['mae_ros']:>10.5f}  {row['max_abs_ros']:>10.5f}  {row['points']}")
    if json_path:
        Path(json_path).write_text(json.dumps(summary, indent=2))
    if plot_path:
        from vla_policy_node.replay.bag_replay import plot
        plot(result.as_bag_replay(), plot_path)
