# SPDX-License-Identifier: Apache-2.0
"""
The LeRobotDataset reader against LeRobot 0.6.1's own reading of datasets it wrote.

The datasets under test/fixtures/lerobot061/datasets/ were written by LeRobot 0.6.1
(``LeRobotDataset.create`` / ``add_frame`` / ``save_episode`` / ``finalize``) and the expected values
beside them (``<name>.expected.json``) are what ``LeRobotDataset(repo_id, root=..., video_backend="pyav")[i]``
returned for every item: tools/lerobot/make_dataset_fixtures.py (``make lerobot-fixtures``). LeRobot is not
needed here.
"""

import hashlib
import json
from pathlib import Path
import shutil

import numpy as np
import pytest

from vla_policy_node.dataset.reader import Dataset, DatasetError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot061" / "datasets"
NAMES = ("video_av1", "video_h264", "images")


def expected(name):
    return json.loads((FIXTURES / f"{name}.expected.json").read_text())


def sha(frame):
    return hashlib.sha256(np.ascontiguousarray(frame).tobytes()).hexdigest()


@pytest.mark.parametrize("name", NAMES)
def test_every_item_equals_lerobots_reading(name):
    """States, actions, timestamps, tasks exactly; every frame bit for bit (its SHA-256 as uint8 HWC)."""
    lerobot = expected(name)
    dataset = Dataset(FIXTURES / name)
    items = iter(lerobot["items"])
    for episode in dataset.episodes:
        data = dataset.episode(episode.index)
        for i in range(episode.length):
            item = next(items)
            assert item["episode_index"] == episode.index and item["frame_index"] == i
            assert data.timestamps[i] == np.float32(item["timestamp"])
            assert data.states[i].tolist() == item["observation.state"]
            assert data.actions[i].tolist() == item["action"]
            assert data.tasks[i] == item["task"]
            assert {f"observation.images.{c}": sha(f[i]) for c, f in data.frames.items()} == item["frames"]
    assert next(items, None) is None


@pytest.mark.parametrize("name", NAMES)
def test_meta_data_as_lerobot_reads_it(name):
    lerobot = expected(name)
    dataset = Dataset(FIXTURES / name)
    assert dataset.fps == lerobot["fps"] and dataset.robot_type == lerobot["robot_type"]
    assert [f"observation.images.{c}" for c in dataset.cameras] == lerobot["cameras"]
    assert {str(i): t for i, t in dataset.tasks.items()} == lerobot["tasks"]
    assert len(dataset.episodes) == lerobot["total_episodes"]
    assert sum(e.length for e in dataset.episodes) == lerobot["total_frames"]
    assert dataset.names("action")[0] == "shoulder_pan.pos" and len(dataset.names("observation.state")) == 6


def test_a_repo_id_is_found_in_lerobots_home_and_in_the_hub_cache(tmp_path, monkeypatch):
    home = tmp_path / "lerobot"
    shutil.copytree(FIXTURES / "images", home / "someone" / "so101_images")
    monkeypatch.setenv("HF_LEROBOT_HOME", str(home))
    assert Dataset("someone/so101_images").root == home / "someone" / "so101_images"
    hub = tmp_path / "hub"
    snapshot = hub / "datasets--someone--other" / "snapshots" / "0123abc"
    shutil.copytree(FIXTURES / "images", snapshot)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert Dataset("someone/other").root == snapshot
    with pytest.raises(DatasetError, match="someone/missing: no such folder, and no dataset of that repo id"):
        Dataset("someone/missing")


@pytest.fixture
def copy(tmp_path):
    def make(name="video_av1"):
        return Path(shutil.copytree(FIXTURES / name, tmp_path / name))
    return make


def edit_info(root, change):
    info = json.loads((root / "meta/info.json").read_text())
    change(info)
    (root / "meta/info.json").write_text(json.dumps(info))


def refusal(call):
    with pytest.raises(DatasetError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_v2_is_refused_with_lerobots_converter(copy):
    root = copy()
    edit_info(root, lambda info: info.update(codebase_version="v2.1"))
    assert "v2.1" in refusal(lambda: Dataset(root)) and "convert_dataset_v21_to_v30" in refusal(lambda: Dataset(root))


def test_missing_or_broken_meta_data_is_refused_naming_the_file(copy, tmp_path):
    root = copy()
    (root / "meta/info.json").write_text("{not json")
    assert "meta/info.json: not JSON" in refusal(lambda: Dataset(root))
    assert "not a LeRobotDataset (no meta/info.json)" in refusal(lambda: Dataset(tmp_path))
    root = copy("images")
    (root / "meta/tasks.parquet").write_bytes(b"PAR1 garbage")
    assert "tasks.parquet: not a readable parquet table" in refusal(lambda: Dataset(root))


def test_a_missing_feature_or_an_unknown_codec_is_refused_naming_it(copy):
    root = copy()
    edit_info(root, lambda info: info["features"].pop("action"))
    assert "no feature 'action'" in refusal(lambda: Dataset(root))
    edit_info(root, lambda info: info["features"]["observation.images.top"]["info"].update(
        {"video.codec": "nosuchcodec"}))
    edit_info(root, lambda info: info["features"].update(action=info["features"]["observation.state"]))
    assert refusal(lambda: Dataset(root)).startswith("observation.images.top: video codec 'nosuchcodec'")


def test_a_corrupt_or_missing_file_is_refused_naming_it(copy):
    root = copy()
    data = root / "data/chunk-000/file-000.parquet"
    data.write_bytes(data.read_bytes()[:300])
    assert "data/chunk-000/file-000.parquet: not a readable parquet table" in refusal(
        lambda: Dataset(root).episode(0))
    root = copy("video_h264")
    video = root / "videos/observation.images.wrist/chunk-000/file-000.mp4"
    video.write_bytes(b"\0" * 64 + video.read_bytes()[64:])
    message = refusal(lambda: Dataset(root).episode(1))
    assert message.startswith("observation.images.wrist: ") and "file-000.mp4" in message
    video.unlink()
    assert "file-000.mp4: missing" in refusal(lambda: Dataset(root).episode(1))


def test_tables_that_disagree_are_refused(copy):
    root = copy("images")
    import pyarrow.parquet as pq
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    lengths = table.column("length").to_pylist()
    lengths[2] += 1
    pq.write_table(table.set_column(table.schema.get_field_index("length"), "length",
                                    __import__("pyarrow").array(lengths)), path)
    assert "episode 2 has 9 rows, its episode table says 10" in refusal(lambda: Dataset(root).episode(2))
    assert "no episode 7" in refusal(lambda: Dataset(root).episode(7))


def test_frames_the_video_does_not_hold_are_refused(copy):
    """A from_timestamp past the video's end: no frame within LeRobot's tolerance."""
    root = copy()
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    column = "videos/observation.images.side/from_timestamp"
    starts = table.column(column).to_pylist()
    starts[4] += 0.05
    pq.write_table(table.set_column(table.schema.get_field_index(column), column, pa.array(starts)), path)
    assert "no frame within 0.0001 s" in refusal(lambda: Dataset(root).episode(4))


@pytest.mark.parametrize("name", NAMES)
def test_some_frames_only_are_the_same_frames(name):
    dataset = Dataset(FIXTURES / name)
    full, some = dataset.episode(2), dataset.episode(2, [0, 3, 8])
    assert some.frame_rows == [0, 3, 8] and np.array_equal(some.states, full.states)
    for camera, frames in full.frames.items():
        assert np.array_equal(some.frames[camera], frames[[0, 3, 8]])
