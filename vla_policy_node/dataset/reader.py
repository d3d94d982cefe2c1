# SPDX-License-Identifier: Apache-2.0
"""
A LeRobotDataset v3.0 read as LeRobot 0.6.1 reads it, from a folder or by repo id from the local cache.

Layout (what ``LeRobotDataset.create`` / ``lerobot-record`` write): ``meta/info.json`` (fps, features,
path templates), ``meta/tasks.parquet``, ``meta/episodes/chunk-*/file-*.parquet`` (per episode its
length, its rows in the data files, and per camera the video file and its ``from_timestamp``),
``data/chunk-*/file-*.parquet`` (one row per frame: state, action, timestamps, indices, and the
frames of image features as PNG bytes) and ``videos/<key>/chunk-*/file-*.mp4`` (all episodes of a
camera in one file). v2.x datasets (one file per episode) are refused with LeRobot's converter.
Every refusal is a :class:`DatasetError` of one line naming the file or the feature.
"""

from __future__ import annotations

from dataclasses import dataclass
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from vla_policy_node.dataset.video import decodable, decode_at, VideoError

STATE, ACTION = 'observation.state', 'action'
IMAGE_PREFIX = 'observation.images.'
CONVERTER = 'python -m lerobot.scripts.convert_dataset_v21_to_v30 --repo-id=REPO_ID'


class DatasetError(ValueError):
    """A dataset that cannot be read as LeRobot would: one line naming the file or the feature."""


@dataclass(frozen=True)
class Episode:
    """One episode's rows in the data files and, per camera key, its video file and start time."""

    index: int
    length: int
    tasks: tuple[str, ...]
    data_file: Path
    from_index: int
    to_index: int
    videos: dict[str, tuple[Path, float]]


@dataclass
class EpisodeData:
    """One episode as LeRobot returns its items: per frame state, action, timestamp, task, frames."""

    index: int
    timestamps: np.ndarray              # (N,) float32 seconds from the episode's start
    states: np.ndarray                  # (N, S) float32, the dataset's units
    actions: np.ndarray                 # (N, A) float32
    tasks: list[str]                    # (N,)
    frames: dict[str, np.ndarray]       # camera name (without observation.images.) -> (R, H, W, 3) uint8
    frame_rows: list[int]               # the R frames held: all N unless fewer were asked for


def locate(source: str | os.PathLike) -> Path:
    """
    Return the dataset folder: ``source`` itself, or the repo id's copy in the local cache (offline).

    Looked up as LeRobot does, under ``$HF_LEROBOT_HOME`` (default ``$HF_HOME/lerobot``), then in the
    Hugging Face hub cache (``datasets--org--name/snapshots/*``), the newest snapshot first.
    """
    path = Path(source).expanduser()
    if (path / 'meta').is_dir() or path.is_dir():
        return path
    hf_home = Path(os.environ.get('HF_HOME', Path.home() / '.cache' / 'huggingface')).expanduser()
    lerobot_home = Path(os.environ.get('HF_LEROBOT_HOME', hf_home / 'lerobot')).expanduser()
    candidates = [lerobot_home / str(source)]
    hub = Path(os.environ.get('HF_HUB_CACHE', hf_home / 'hub')).expanduser()
    for cache in (hub, lerobot_home / 'hub'):
        snapshots = cache / f"datasets--{str(source).replace('/', '--')}" / 'snapshots'
        if snapshots.is_dir():
            candidates += sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    for candidate in candidates:
        if (candidate / 'meta' / 'info.json').is_file():
            return candidate
    raise DatasetError(f'{source}: no such folder, and no dataset of that repo id in the local cache '
                       f'({lerobot_home} or {hub}); download it first (huggingface-cli download --repo-type '
                       f'dataset {source})')


def _read_table(path: Path) -> Any:
    import pyarrow.parquet as pq
    if not path.is_file():
        raise DatasetError(f'{path}: missing (the dataset lists it)')
    try:
        return pq.read_table(path)
    except Exception as error:  # noqa: B902 - pyarrow raises several kinds on a damaged file
        raise DatasetError(f'{path}: not a readable parquet table ({type(error).__name__}: '
                           f'{(str(error).splitlines() or [""])[0][:160]})') from None


class Dataset:
    """A LeRobotDataset v3.0 opened for reading: its meta data now, episodes on demand."""

    def __init__(self, source: str | os.PathLike) -> None:
        self.root = locate(source)
        self._cached: tuple[Path, dict[str, list]] | None = None
        self.info = self._info()
        self.fps = float(self.info['fps'])
        self.features: dict[str, dict[str, Any]] = self.info['features']
        for key in (STATE, ACTION):
            if key not in self.features:
                raise DatasetError(f'{self.root / "meta/info.json"}: no feature {key!r} (it has '
                                   f'{sorted(self.features)})')
        self.video_keys = [k for k, f in self.features.items() if f.get('dtype') == 'video']
        self.image_keys = [k for k, f in self.features.items() if f.get('dtype') == 'image']
        self._check_codecs()
        self.tasks = self._tasks()
        self.episodes = self._episodes()

    @property
    def cameras(self) -> list[str]:
        """Camera names: the image and video features without ``observation.images.``."""
        return [k.removeprefix(IMAGE_PREFIX) for k in self.features
                if k in self.video_keys or k in self.image_keys]

    @property
    def robot_type(self) -> str | None:
        """Return the robot the dataset was recorded on (``so101_follower``), if it says."""
        return self.info.get('robot_type')

    def names(self, key: str) -> list[str]:
        """Return the per-element names of a vector feature (``shoulder_pan.pos``, ...), or numbered ones."""
        feature = self.features[key]
        names = feature.get('names')
        if isinstance(names, dict):
            names = next(iter(names.values()), None)
        size = int(np.prod(feature['shape']))
        return list(names) if isinstance(names, list) and len(names) == size else [f'{key}[{i}]' for i in range(size)]

    def _info(self) -> dict[str, Any]:
        path = self.root / 'meta' / 'info.json'
        if not path.is_file():
            raise DatasetError(f'{self.root}: not a LeRobotDataset (no meta/info.json)')
        try:
            info = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise DatasetError(f'{path}: not JSON ({error})') from None
        version = str(info.get('codebase_version', ''))
        if version.startswith('v2'):
            raise DatasetError(f'{self.root}: LeRobotDataset {version}; this reader reads v3.0: convert it with '
                               f'LeRobot ({CONVERTER})')
        if version != 'v3.0':
            raise DatasetError(f'{path}: codebase_version {version!r}, expected v3.0')
        missing = [k for k in ('fps', 'features', 'data_path') if k not in info]
        if missing:
            raise DatasetError(f'{path}: no {", ".join(missing)}')
        return info

    def _check_codecs(self) -> None:
        for key in self.video_keys:
            codec = self.features[key].get('info', {}).get('video.codec')
            if codec is not None and not decodable(codec):
                raise DatasetError(f'{key}: video codec {codec!r}, which this PyAV build cannot decode')

    def _tasks(self) -> dict[int, str]:
        table = _read_table(self.root / 'meta' / 'tasks.parquet').to_pydict()
        names = table.get('task') or table.get('__index_level_0__')
        if names is None or 'task_index' not in table:
            raise DatasetError(f'{self.root / "meta/tasks.parquet"}: no task and task_index columns')
        return {int(i): str(t) for i, t in zip(table['task_index'], names)}

    def _episodes(self) -> list[Episode]:
        files = sorted((self.root / 'meta' / 'episodes').glob('chunk-*/file-*.parquet'))
        if not files:
            raise DatasetError(f'{self.root / "meta/episodes"}: no episode tables')
        episodes = []
        for path in files:
            rows = _read_table(path).to_pylist()
            for row in rows:
                try:
                    episodes.append(self._episode(row))
                except KeyError as error:
                    raise DatasetError(f'{path}: no column {error.args[0]!r}') from None
        return sorted(episodes, key=lambda e: e.index)

    def _episode(self, row: dict[str, Any]) -> Episode:
        data = self.root / self.info['data_path'].format(chunk_index=row['data/chunk_index'],
                                                         file_index=row['data/file_index'])
        videos = {}
        for key in self.video_keys:
            path = self.root / self.info['video_path'].format(
                video_key=key, chunk_index=row[f'videos/{key}/chunk_index'],
                file_index=row[f'videos/{key}/file_index'])
            videos[key] = (path, float(row[f'videos/{key}/from_timestamp']))
        return Episode(int(row['episode_index']), int(row['length']), tuple(row.get('tasks') or ()), data,
                       int(row['dataset_from_index']), int(row['dataset_to_index']), videos)

    def episode(self, index: int, frame_rows: list[int] | None = None) -> EpisodeData:
        """
        Read episode ``index`` (its number in the dataset); DatasetError naming what is wrong.

        ``frame_rows``: decode the camera frames of these frames only (default: all), to spare memory.
        """
        episode = next((e for e in self.episodes if e.index == index), None)
        if episode is None:
            raise DatasetError(f'{self.root}: no episode {index} (it has {[e.index for e in self.episodes]})')
        columns = self._columns(episode.data_file)
        for key in (STATE, ACTION, 'timestamp', 'index', 'task_index', *self.image_keys):
            if key not in columns:
                raise DatasetError(f'{episode.data_file}: no column {key!r}')
        rows = [i for i, n in enumerate(columns['index']) if episode.from_index <= n < episode.to_index]
        if len(rows) != episode.length:
            raise DatasetError(f'{episode.data_file}: episode {index} has {len(rows)} rows, its episode table '
                               f'says {episode.length}')
        timestamps = np.asarray([columns['timestamp'][i] for i in rows], dtype=np.float32)
        vectors = {key: self._vectors(columns[key], rows, key, episode.data_file) for key in (STATE, ACTION)}
        try:
            tasks = [self.tasks[int(columns['task_index'][i])] for i in rows]
        except KeyError as error:
            raise DatasetError(f'{episode.data_file}: task_index {error.args[0]} is not in '
                               'meta/tasks.parquet') from None
        wanted = list(range(len(rows))) if frame_rows is None else list(frame_rows)
        frames = {}
        for key, (path, start) in episode.videos.items():
            try:
                frames[key.removeprefix(IMAGE_PREFIX)] = decode_at(path, start + timestamps[wanted].astype(np.float64))
            except VideoError as error:
                raise DatasetError(f'{key}: {error}') from None
        for key in self.image_keys:
            frames[key.removeprefix(IMAGE_PREFIX)] = np.stack(
                [_png(columns[key][rows[i]], key, episode.data_file) for i in wanted])
        return EpisodeData(index, timestamps, vectors[STATE], vectors[ACTION], tasks, frames, wanted)

    def _columns(self, path: Path) -> dict[str, list]:
        """Return a data file's columns; the last file read is kept (a file holds many episodes, read in order)."""
        if self._cached is None or self._cached[0] != path:
            self._cached = (path, _read_table(path).to_pydict())
        return self._cached[1]

    def _vectors(self, column: list[Any], rows: list[int], key: str, path: Path) -> np.ndarray:
        size = int(np.prod(self.features[key]['shape']))
        values = [column[i] for i in rows]
        if any(v is None or len(v) != size for v in values):
            raise DatasetError(f'{path}: {key} rows are not {size} values each, as meta/info.json says')
        return np.asarray(values, dtype=np.float32).reshape(len(rows), size)


def _png(cell: Any, key: str, path: Path) -> np.ndarray:
    """Decode one image cell (``{"bytes": PNG, "path": ...}``) as LeRobot does: PIL, RGB."""
    from PIL import Image, UnidentifiedImageError
    data = cell.get('bytes') if isinstance(cell, dict) else None
    if not data:
        raise DatasetError(f'{path}: a {key} cell holds no image bytes')
    try:
        return np.asarray(Image.open(io.BytesIO(data)).convert('RGB'))
    except (UnidentifiedImageError, OSError) as error:
        raise DatasetError(f'{path}: a {key} image cannot be decoded ({error})') from None
