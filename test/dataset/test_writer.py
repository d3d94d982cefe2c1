# SPDX-License-Identifier: Apache-2.0
"""
The LeRobotDataset writer: the files LeRobot 0.6.1 writes, read back by the project's reader.

The reference layout is LeRobot 0.6.1's own (test/fixtures/lerobot061/datasets/video_av1, written by
``LeRobotDataset.create`` ... ``finalize`` in tools/lerobot/make_dataset_fixtures.py). That LeRobot itself opens
the writer's output with the same values is checked outside make test (``make lerobot-export-check``).
"""

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from vla_policy_node.dataset.reader import Dataset
from vla_policy_node.dataset.writer import DatasetWriter

LEROBOT = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot061" / "datasets" / "video_av1"


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory):
    """Read the LeRobot-written fixture with the reader and write it again with the writer."""
    source = Dataset(LEROBOT)
    out = tmp_path_factory.mktemp("writer") / "copy"
    with DatasetWriter(out, 10, source.names("observation.state"), source.names("action"), "so101_follower") as writer:
        for episode in source.episodes:
            data = source.episode(episode.index)
            writer.start_episode(data.tasks[0])
            for i in range(episode.length):
                writer.add_frame(data.states[i], data.actions[i], {c: f[i] for c, f in data.frames.items()})
        writer.finish()
    return source, out


def test_the_files_and_columns_are_lerobots(rewritten):
    _, out = rewritten
    ours = {p.relative_to(out) for p in out.rglob("*") if p.is_file()}
    theirs = {p.relative_to(LEROBOT) for p in LEROBOT.rglob("*") if p.is_file()}
    assert ours == theirs
    for name in ("data/chunk-000/file-000.parquet", "meta/episodes/chunk-000/file-000.parquet", "meta/tasks.parquet"):
        assert set(pq.read_schema(out / name).names) == set(pq.read_schema(LEROBOT / name).names), name
    assert pq.read_schema(out / "data/chunk-000/file-000.parquet").types == \
        pq.read_schema(LEROBOT / "data/chunk-000/file-000.parquet").types
    info, lerobot = (json.loads((p / "meta/info.json").read_text()) for p in (out, LEROBOT))
    assert set(info) == set(lerobot) and info["features"].keys() == lerobot["features"].keys()
    for key in ("codebase_version", "fps", "total_episodes", "total_frames", "total_tasks", "data_path", "video_path",
                "robot_type", "splits"):
        assert info[key] == lerobot[key], key
    stats, lerobot_stats = (json.loads((p / "meta/stats.json").read_text()) for p in (out, LEROBOT))
    assert stats.keys() == lerobot_stats.keys() and stats["action"].keys() == lerobot_stats["action"].keys()
    np.testing.assert_allclose(stats["action"]["mean"], lerobot_stats["action"]["mean"], rtol=1e-6)
    np.testing.assert_allclose(stats["action"]["std"], lerobot_stats["action"]["std"], rtol=1e-6)


def test_the_values_read_back(rewritten):
    source, out = rewritten
    copy = Dataset(out)
    assert copy.tasks == source.tasks and [e.length for e in copy.episodes] == [e.length for e in source.episodes]
    for episode in source.episodes:
        a, b = source.episode(episode.index), copy.episode(episode.index)
        assert np.array_equal(a.states, b.states) and np.array_equal(a.actions, b.actions) and a.tasks == b.tasks
        np.testing.assert_array_equal(a.timestamps, b.timestamps)
        for camera in a.frames:             # AV1 again: lossy, but the same pictures
            assert np.abs(a.frames[camera].astype(int) - b.frames[camera]).mean() < 12


def test_a_failed_write_leaves_nothing(tmp_path):
    frame = {"top": np.zeros((24, 32, 3), np.uint8)}
    with pytest.raises(ValueError, match="camera 'top' changes size"):
        with DatasetWriter(tmp_path / "out", 10, ["a"], ["a"]) as writer:
            writer.start_episode("task")
            writer.add_frame([0.0], [0.0], frame)
            writer.add_frame([0.0], [0.0], {"top": np.zeros((24, 30, 3), np.uint8)})
    with pytest.raises(ValueError, match="no episode to write"):
        with DatasetWriter(tmp_path / "out", 10, ["a"], ["a"]) as writer:
            writer.start_episode("task")
            writer.finish()
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError):
        DatasetWriter(tmp_path / "taken", 10, ["a"], ["a"])
