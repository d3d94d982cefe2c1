# SPDX-License-Identifier: Apache-2.0
"""
The recorder's bag and queue without DDS: crash-safe MCAP, its recovery, counted drops, a failing disk.

A clock the test moves decides when chunks close; a file copied at some moment is what a killed
recorder leaves; zeros after the data are what a power loss can leave.
"""

from __future__ import annotations

import errno
import shutil
import time

from hypothesis import given, settings, strategies as st
import pytest
from rclpy.serialization import serialize_message
from rosbags.highlevel import AnyReader
from std_msgs.msg import String
import yaml

from vla_policy_node.replay.bag import read_messages
from vla_policy_node.replay.recording import Recording
from vla_policy_node.replay.recording_bag import FLUSH_PERIOD, RecordingBag
from vla_policy_node.replay.recovery import close_unfinished

TOPICS = [('/a', 'std_msgs/msg/String'), ('/b', 'std_msgs/msg/String')]


def raw(text: str) -> bytes:
    """Serialize a String as DDS delivers it (rclpy may append padding: cut at the message's end)."""
    data = serialize_message(String(data=text))
    return data[:4 + 4 + len(text) + 1]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def written_bag(folder, messages: int, close: bool = True, snapshot_at: int | None = None):
    """Write ``messages`` strings, alternating topics, 0.05 s apart on the bag's clock; copy the file at a moment."""
    folder.mkdir()
    clock = Clock()
    bag = RecordingBag(folder, TOPICS, clock=clock)
    snapshot = None
    for i in range(messages):
        bag.write(i % 2, 10**9 + i * 10**6, raw(f'message {i}'))
        clock.now += 0.05
        bag.tick()
        if i == snapshot_at:
            snapshot = bag.path.read_bytes()
    if close:
        bag.close()
    return bag, snapshot


def texts(path) -> list[str]:
    return [msg.data for _, _, msg, _ in read_messages(path)]


def test_a_closed_bag_is_a_rosbag2_folder_with_every_message(tmp_path):
    bag, _ = written_bag(tmp_path / 'bag', 50)
    assert texts(tmp_path / 'bag') == [f'message {i}' for i in range(50)]
    info = yaml.safe_load((tmp_path / 'bag' / 'metadata.yaml').read_text())['rosbag2_bagfile_information']
    assert info['message_count'] == 50 and [t['message_count'] for t in info['topics_with_message_count']] == [25, 25]
    assert close_unfinished(bag.path) is None


def test_a_killed_recorder_leaves_a_bag_readers_open_as_it_is(tmp_path):
    """
    The file as it was after message 30: it ends as a closed one, readable without any recovery.

    Chunks close every FLUSH_PERIOD, so at most that much is missing; the recovery only brings
    metadata.yaml (rewritten every second) to the file's counts.
    """
    bag, snapshot = written_bag(tmp_path / 'bag', 40, snapshot_at=30)
    bag.path.write_bytes(snapshot)
    with AnyReader([tmp_path / 'bag']) as reader:         # the rosbag2 folder, as it is
        kept = [msg.data for _, _, msg in ((c, t, reader.deserialize(r, c.msgtype))
                                           for c, t, r in reader.messages())]
    assert kept == [f'message {i}' for i in range(len(kept))]
    assert 31 - FLUSH_PERIOD / 0.05 - 1 <= len(kept) <= 31
    recovered = close_unfinished(bag.path)
    assert recovered.messages == len(kept) and recovered.cut_bytes == 0 and close_unfinished(bag.path) is None
    info = yaml.safe_load((tmp_path / 'bag' / 'metadata.yaml').read_text())['rosbag2_bagfile_information']
    assert info['message_count'] == len(kept) and texts(tmp_path / 'bag') == kept


def test_zeros_after_a_power_loss_and_a_corrupt_last_chunk_are_cut(tmp_path):
    bag, snapshot = written_bag(tmp_path / 'bag', 40, close=False, snapshot_at=30)
    bag.path.write_bytes(snapshot + bytes(4096))            # the size grew, the data never reached the disk
    assert close_unfinished(bag.path).messages >= 25
    whole = texts(tmp_path / 'bag')
    bag.path.write_bytes(snapshot[:-40] + bytes(b ^ 0xFF for b in snapshot[-40:-20]) + snapshot[-20:])
    kept = close_unfinished(bag.path).messages
    assert kept <= len(whole) and texts(tmp_path / 'bag') == whole[:kept]


@settings(max_examples=25, deadline=None)
@given(cut=st.floats(0.0, 1.0))
def test_a_file_cut_anywhere_keeps_a_prefix_of_its_messages(tmp_path_factory, cut):
    folder = tmp_path_factory.mktemp('cut')
    bag, _ = written_bag(folder / 'bag', 30)
    data = bag.path.read_bytes()
    bag.path.write_bytes(data[:int(len(data) * cut)])
    try:
        close_unfinished(bag.path)
    except ValueError as error:
        assert 'MCAP' in str(error)         # cut inside the header: nothing to keep
        return
    kept = texts(folder / 'bag')
    assert kept == [f'message {i}' for i in range(len(kept))]


class SlowBag:
    """A bag whose writes take ``delay`` s and fail with ``error`` from write number ``fail_at``."""

    def __init__(self, delay: float = 0.0, fail_at: int | None = None) -> None:
        self.delay, self.fail_at, self.written = delay, fail_at, []
        self.closed = self.abandoned = False

    def write(self, topic, log_time, data, publish_time=None) -> None:
        if self.fail_at is not None and len(self.written) >= self.fail_at:
            raise OSError(errno.EFBIG, 'File too large')
        time.sleep(self.delay)
        self.written.append((topic, log_time, data))

    def tick(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def abandon(self):
        self.abandoned = True


def test_a_full_queue_drops_and_counts_per_topic_never_blocking_the_caller():
    bag = SlowBag(delay=0.01)
    recording = Recording(bag, ['/camera', '/joints'], time.monotonic_ns, max_bytes=10_000)
    started = time.monotonic()
    for i in range(200):
        recording.put(i % 2, bytes(1000))
    assert time.monotonic() - started < 0.5            # put never waits for the disk
    recording.close()
    for counts in recording.counts:
        assert counts.received == 100 and counts.written + counts.dropped == 100 and counts.dropped > 0
    assert len(bag.written) == sum(c.written for c in recording.counts) and bag.closed
    times = [t for _, t, _ in bag.written]
    assert times == sorted(times)


def test_a_failing_disk_stops_the_writing_once_and_counts_the_rest_dropped():
    failures = []
    bag = SlowBag(fail_at=5)
    recording = Recording(bag, ['/camera'], time.monotonic_ns, on_failure=failures.append)
    for _ in range(20):
        recording.put(0, b'x')
    deadline = time.monotonic() + 5.0
    while not failures and time.monotonic() < deadline:
        time.sleep(0.01)
    recording.put(0, b'late')
    recording.close()
    assert len(failures) == 1 and failures[0].errno == errno.EFBIG and bag.abandoned and not bag.closed
    counts = recording.counts[0]
    assert counts.received == 21 and counts.written == 0 and counts.dropped == 21   # nothing recovered by the fake


def test_sequence_gaps_of_one_publisher_count_as_lost():
    recording = Recording(SlowBag(), ['/camera'], time.monotonic_ns)
    recording.counts[0].single_publisher = True
    for sequence in (1, 2, 5, 6, 9):
        recording.put(0, b'frame', sequence)
    recording.put(0, b'frame', 1)                      # a new publisher starts again from 1: no loss
    recording.close()
    assert recording.counts[0].lost == 4 and recording.counts[0].written == 6


def test_recovery_is_idempotent_and_refuses_a_file_that_is_not_mcap(tmp_path):
    bag, snapshot = written_bag(tmp_path / 'bag', 20, close=False, snapshot_at=15)
    bag.path.write_bytes(snapshot[:-20])                    # killed inside a write: its end is broken
    copy = tmp_path / 'copy.mcap'
    shutil.copy(bag.path, copy)
    assert close_unfinished(copy).cut_bytes > 0 and close_unfinished(copy) is None
    png = tmp_path / 'image.mcap'
    png.write_bytes(b'\x89PNG\r\n\x1a\n' + bytes(100))
    with pytest.raises(ValueError, match='does not start as an MCAP file'):
        close_unfinished(png)


def test_a_full_disk_mid_chunk_leaves_a_bag_ended_after_its_last_chunk(tmp_path, monkeypatch):
    """ENOSPC part-way through a chunk's write: the written part is cut, counts are what the file holds."""
    import vla_policy_node.replay.recording_bag as recording_bag
    folder = tmp_path / 'bag'
    folder.mkdir()
    clock = Clock()
    bag = RecordingBag(folder, TOPICS, clock=clock)
    real_pwrite, budget = recording_bag.os.pwrite, [bag.path.stat().st_size + 3000]

    def pwrite(fd, data, offset):      # the disk takes `budget` bytes more, then refuses
        if offset + len(data) > budget[0]:
            written = real_pwrite(fd, bytes(data[:max(0, budget[0] - offset)]), offset)
            if written:
                return written
            raise OSError(errno.ENOSPC, 'No space left on device')
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(recording_bag.os, 'pwrite', pwrite)
    failures = []
    recording = Recording(bag, [name for name, _ in TOPICS], time.monotonic_ns, on_failure=failures.append)
    for i in range(200):
        recording.put(i % 2, raw(f'message {i}'))
        if i % 20 == 19:        # a chunk of 20: let the writer close it before the next
            deadline = time.monotonic() + 5.0
            while recording.queued_bytes and time.monotonic() < deadline:
                time.sleep(0.001)
            clock.now += FLUSH_PERIOD
            time.sleep(2 * FLUSH_PERIOD)
    recording.close()
    assert len(failures) == 1 and failures[0].errno == errno.ENOSPC
    kept = texts(folder)
    assert 0 < len(kept) < 200 and kept == [f'message {i}' for i in range(len(kept))]
    assert sum(c.written for c in recording.counts) == len(kept)
    assert sum(c.dropped for c in recording.counts) == 200 - len(kept)


def test_a_killed_bag_on_a_read_only_folder_is_read_as_it_is(tmp_path, monkeypatch):
    """metadata.yaml cannot be corrected there: the file, ended by its last chunk write, still reads."""
    import vla_policy_node.replay.recovery as recovery
    bag, snapshot = written_bag(tmp_path / 'bag', 40, snapshot_at=30)
    bag.path.write_bytes(snapshot)

    def read_only(path, text):
        raise PermissionError(13, 'Read-only file system')

    monkeypatch.setattr(recovery, 'replace_text', read_only)
    assert close_unfinished(bag.path) is None
    kept = texts(tmp_path / 'bag')
    assert kept == [f'message {i}' for i in range(len(kept))] and len(kept) >= 27
