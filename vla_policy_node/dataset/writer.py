# SPDX-License-Identifier: Apache-2.0
"""
A LeRobotDataset v3.0 written as LeRobot 0.6.1 writes it, without LeRobot (pyarrow, PyAV).

The files and their columns are LeRobot's (``LeRobotDataset.create`` ... ``finalize``, compared with
the datasets under test/fixtures/lerobot061/datasets): ``meta/info.json`` (its features, video info,
path templates and totals), ``meta/stats.json`` and per-episode ``stats/...`` columns (min, max, mean,
std, count, q01..q99; images per channel in [0, 1]), ``meta/tasks.parquet`` (indexed by task, as
pandas writes it), ``meta/episodes/chunk-000/file-000.parquet``, ``data/chunk-000/file-000.parquet``
and one MP4 per camera holding every episode (LeRobot's default codec AV1 via libsvtav1, yuv420p,
keyframe every 2 frames, crf 30; or H.264), each episode located by its ``from_timestamp``.
Everything is written into a temporary folder beside the target and renamed at the end, so a
failed export leaves nothing behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import json
import os
from pathlib import Path
import shutil
import tempfile

import numpy as np

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
CODECS = {'av1': ('libsvtav1', {'g': '2', 'crf': '30', 'preset': '12'}),
          'h264': ('h264', {'g': '2', 'crf': '30'})}
DATA_PATH = 'data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet'
VIDEO_PATH = 'videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4'


def feature_stats(values: np.ndarray, axes: tuple[int, ...] = (0,)) -> dict[str, list]:
    """Return LeRobot's statistics of one feature: over ``axes``, keeping the others (images: per channel)."""
    values = np.asarray(values, dtype=np.float64)
    keep = len(axes) > 1
    out = {'min': values.min(axis=axes, keepdims=keep), 'max': values.max(axis=axes, keepdims=keep),
           'mean': values.mean(axis=axes, keepdims=keep), 'std': values.std(axis=axes, keepdims=keep)}
    for q in QUANTILES:
        out[f'q{round(q * 100):02d}'] = np.quantile(values, q, axis=axes, keepdims=keep)
    result = {k: (v[0] if keep else v).tolist() for k, v in out.items()}
    result['count'] = [int(values.shape[0])]
    order = ('min', 'max', 'mean', 'std', 'count', *[f'q{round(q * 100):02d}' for q in QUANTILES])
    return {k: result[k] for k in order}


class _Video:
    """One camera's MP4, every episode in it, encoded as the frames come (frame i at i / fps)."""

    def __init__(self, path: Path, fps: int, codec: str, shape: tuple[int, ...]) -> None:
        os.environ.setdefault('SVT_LOG', '1')     # SVT-AV1 prints its whole configuration per file otherwise
        import av
        name, options = CODECS[codec]
        path.parent.mkdir(parents=True, exist_ok=True)
        self.shape = shape
        self.av = av
        self.container = av.open(str(path), 'w')
        self.stream = self.container.add_stream(name, fps, options=options)
        self.stream.pix_fmt = 'yuv420p'
        self.stream.height, self.stream.width = shape[:2]

    def add(self, frame: np.ndarray) -> None:
        image = self.av.VideoFrame.from_ndarray(np.ascontiguousarray(frame, dtype=np.uint8), format='rgb24')
        self.container.mux(self.stream.encode(image))

    def close(self, flush: bool = True) -> None:
        if flush:
            self.container.mux(self.stream.encode())
        self.container.close()


@dataclass
class _Episode:
    task: str
    states: list = field(default_factory=list)
    actions: list = field(default_factory=list)
    thumbnails: dict = field(default_factory=dict)    # camera -> every THUMB_EVERY-th frame, subsampled (stats)


THUMB_EVERY, THUMB_SIDE = 5, 64        # image statistics from every 5th frame, at most 64 px a side


class DatasetWriter:
    """
    Write a dataset frame by frame: videos are encoded as the frames come, so a long recording never sits in memory.

    Everything goes to a hidden folder beside ``root``, renamed to ``root`` by :meth:`finish`; :meth:`abort`
    (or leaving the ``with`` block by an exception) removes it.
    """

    def __init__(self, root: str | Path, fps: int, state_names: list[str], action_names: list[str],
                 robot_type: str | None = None, codec: str = 'av1') -> None:
        self.root, self.fps, self.codec, self.robot_type = Path(root), int(fps), codec, robot_type
        self.state_names, self.action_names = list(state_names), list(action_names)
        if codec not in CODECS:
            raise ValueError(f'codec {codec!r}: one of {sorted(CODECS)}')
        if self.root.exists():
            raise FileExistsError(f'{self.root} exists: give a new folder')
        self.root.parent.mkdir(parents=True, exist_ok=True)
        self.staging = Path(tempfile.mkdtemp(prefix=f'.{self.root.name}.', dir=self.root.parent))
        self.videos: dict[str, _Video] = {}
        self.episodes: list[_Episode] = []
        self.current: _Episode | None = None

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, kind: object, *rest: object) -> None:
        if kind is not None:
            self.abort()

    def start_episode(self, task: str) -> None:
        """End the episode being written, if any, and start one of ``task``."""
        self.end_episode()
        self.current = _Episode(task)

    def add_frame(self, state: np.ndarray, action: np.ndarray, frames: dict[str, np.ndarray]) -> None:
        """Add a frame to the current episode: state, action (dataset units), camera name -> (H, W, 3) uint8."""
        if self.videos and sorted(frames) != sorted(self.videos):
            raise ValueError(f'every frame needs the same cameras ({sorted(self.videos)}), not {sorted(frames)}')
        for camera, image in frames.items():
            video = self.videos.get(camera)
            if video is None:
                path = self.staging / VIDEO_PATH.format(video_key=IMAGES + camera, chunk_index=0, file_index=0)
                video = self.videos[camera] = _Video(path, self.fps, self.codec, image.shape)
            if image.shape != video.shape:
                raise ValueError(f'camera {camera!r} changes size ({video.shape[:2]} to {image.shape[:2]}): a '
                                 'dataset video has one size')
            video.add(image)
            if len(self.current.states) % THUMB_EVERY == 0:
                step = max(1, -(-max(image.shape[:2]) // THUMB_SIDE))
                self.current.thumbnails.setdefault(camera, []).append(np.asarray(image)[::step, ::step])
        self.current.states.append(np.asarray(state, np.float32))
        self.current.actions.append(np.asarray(action, np.float32))

    def end_episode(self) -> None:
        """End the current episode (one without frames is dropped)."""
        if self.current is not None and self.current.states:
            self.episodes.append(self.current)
        self.current = None

    def finish(self) -> None:
        """Write the tables and rename the folder to ``root``; ValueError (and nothing left) if no frame came."""
        self.end_episode()
        try:
            if not self.episodes:
                raise ValueError('no episode to write')
            for video in self.videos.values():
                video.close()
            self._write(self.staging)
            self.staging.rename(self.root)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Remove everything written so far."""
        for video in self.videos.values():
            try:
                video.close(flush=False)
            except Exception:  # noqa: B902 - already closed, or broken: the folder goes anyway
                pass
        self.videos = {}
        shutil.rmtree(self.staging, ignore_errors=True)

    def _tasks(self) -> list[str]:
        return list(dict.fromkeys(e.task for e in self.episodes))

    def _write(self, root: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq
        tasks = self._tasks()
        columns = self._data_columns(tasks)
        (root / 'data/chunk-000').mkdir(parents=True)
        schema = pa.schema([(STATE_KEY, pa.list_(pa.float32(), len(self.state_names))),
                            ('action', pa.list_(pa.float32(), len(self.action_names))),
                            ('timestamp', pa.float32()), ('frame_index', pa.int64()), ('episode_index', pa.int64()),
                            ('index', pa.int64()), ('task_index', pa.int64())])
        pq.write_table(pa.table(columns, schema=schema), root / DATA_PATH.format(chunk_index=0, file_index=0))
        cameras = list(self.videos)
        episode_rows, stats = self._episode_rows(tasks, cameras)
        (root / 'meta/episodes/chunk-000').mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(episode_rows), root / 'meta/episodes/chunk-000/file-000.parquet')
        pandas = {'index_columns': ['task'], 'column_indexes': [
            {'name': None, 'field_name': None, 'pandas_type': 'unicode', 'numpy_type': 'object',
             'metadata': {'encoding': 'UTF-8'}}], 'columns': [
            {'name': 'task_index', 'field_name': 'task_index', 'pandas_type': 'int64', 'numpy_type': 'int64',
             'metadata': None},
            {'name': 'task', 'field_name': 'task', 'pandas_type': 'unicode', 'numpy_type': 'object', 'metadata': None}],
            'attributes': {}, 'creator': {'library': 'pyarrow', 'version': pa.__version__}, 'pandas_version': '2.3.3'}
        table = pa.table({'task_index': pa.array(range(len(tasks)), pa.int64()), 'task': pa.array(tasks, pa.string())})
        pq.write_table(table.replace_schema_metadata({'pandas': json.dumps(pandas)}), root / 'meta/tasks.parquet')
        (root / 'meta/stats.json').write_text(json.dumps(stats, indent=4))
        (root / 'meta/info.json').write_text(json.dumps(self._info(cameras, len(tasks)), indent=4))

    def _data_columns(self, tasks: list[str]) -> dict[str, list]:
        keys = (STATE_KEY, 'action', 'timestamp', 'frame_index', 'episode_index', 'index', 'task_index')
        columns: dict[str, list] = {k: [] for k in keys}
        index = 0
        for number, episode in enumerate(self.episodes):
            n = len(episode.states)
            columns[STATE_KEY] += np.asarray(episode.states).tolist()
            columns['action'] += np.asarray(episode.actions).tolist()
            columns['timestamp'] += (np.arange(n, dtype=np.float32) / np.float32(self.fps)).tolist()
            columns['frame_index'] += list(range(n))
            columns['episode_index'] += [number] * n
            columns['index'] += list(range(index, index + n))
            columns['task_index'] += [tasks.index(episode.task)] * n
            index += n
        return columns

    def _episode_rows(self, tasks: list[str], cameras: list[str]) -> tuple[list[dict], dict]:
        rows, start, every = [], 0, {}
        for number, episode in enumerate(self.episodes):
            n = len(episode.states)
            row = {'episode_index': number, 'tasks': [episode.task], 'length': n, 'data/chunk_index': 0,
                   'data/file_index': 0, 'dataset_from_index': start, 'dataset_to_index': start + n}
            for camera in cameras:
                key = f'videos/{IMAGES}{camera}'
                row.update({f'{key}/chunk_index': 0, f'{key}/file_index': 0, f'{key}/from_timestamp': start / self.fps,
                            f'{key}/to_timestamp': (start + n) / self.fps})
            values = {STATE_KEY: np.asarray(episode.states), 'action': np.asarray(episode.actions),
                      'timestamp': np.arange(n, dtype=np.float32)[:, None] / np.float32(self.fps),
                      'frame_index': np.arange(n)[:, None], 'episode_index': np.full((n, 1), number),
                      'index': np.arange(start, start + n)[:, None],
                      'task_index': np.full((n, 1), tasks.index(episode.task))}
            stats = {key: feature_stats(v) for key, v in values.items()}
            for camera in cameras:
                thumbnails = np.stack(episode.thumbnails[camera]).transpose(0, 3, 1, 2) / 255.0
                stats[IMAGES + camera] = feature_stats(thumbnails, (0, 2, 3))
            for key, feature in stats.items():
                for name, value in feature.items():
                    every.setdefault(key, {}).setdefault(name, []).append(np.asarray(value, dtype=np.float64))
                    row[f'stats/{key}/{name}'] = value
            row.update({'meta/episodes/chunk_index': 0, 'meta/episodes/file_index': 0})
            rows.append(row)
            start += n
        return rows, {key: _aggregate(feature) for key, feature in every.items()}

    def _info(self, cameras: list[str], total_tasks: int) -> dict:
        features = {STATE_KEY: {'dtype': 'float32', 'shape': [len(self.state_names)], 'names': self.state_names},
                    'action': {'dtype': 'float32', 'shape': [len(self.action_names)], 'names': self.action_names}}
        for camera in cameras:
            height, width = self.videos[camera].shape[:2]
            features[IMAGES + camera] = {
                'dtype': 'video', 'shape': [height, width, 3], 'names': ['height', 'width', 'channels'],
                'info': {'video.height': height, 'video.width': width, 'video.codec': self.codec,
                         'video.pix_fmt': 'yuv420p', 'video.fps': self.fps, 'video.channels': 3, 'has_audio': False,
                         'video.g': 2, 'video.crf': 30, 'is_depth_map': False}}
        for name, dtype in (('timestamp', 'float32'), ('frame_index', 'int64'), ('episode_index', 'int64'),
                            ('index', 'int64'), ('task_index', 'int64')):
            features[name] = {'dtype': dtype, 'shape': [1], 'names': None}
        frames = sum(len(e.states) for e in self.episodes)
        return {'codebase_version': 'v3.0', 'fps': self.fps, 'features': features,
                'total_episodes': len(self.episodes), 'total_frames': frames, 'total_tasks': total_tasks,
                'chunks_size': 1000, 'data_files_size_in_mb': 100, 'video_files_size_in_mb': 200,
                'data_path': DATA_PATH, 'video_path': VIDEO_PATH if cameras else None,
                'robot_type': self.robot_type, 'splits': {'train': f'0:{len(self.episodes)}'}}


STATE_KEY, IMAGES = 'observation.state', 'observation.images.'


def _aggregate(feature: dict[str, list[np.ndarray]]) -> dict[str, list]:
    """Dataset statistics from the episodes' (LeRobot's aggregation: count-weighted means and variances)."""
    counts = np.array([c[0] for c in feature['count']], dtype=np.float64)
    shape = (-1,) + (1,) * (feature['mean'][0].ndim)
    weights = counts.reshape(shape) / counts.sum()
    means = np.stack(feature['mean'])
    mean = (means * weights).sum(axis=0)
    variance = ((np.stack(feature['std']) ** 2 + (means - mean) ** 2) * weights).sum(axis=0)
    out = {'min': np.min(np.stack(feature['min']), axis=0), 'max': np.max(np.stack(feature['max']), axis=0),
           'mean': mean, 'std': np.sqrt(variance), 'count': np.array([int(counts.sum())])}
    for q in QUANTILES:
        name = f'q{round(q * 100):02d}'
        out[name] = (np.stack(feature[name]) * weights).sum(axis=0)
    return {k: v.tolist() for k, v in out.items()}
