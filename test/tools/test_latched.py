# SPDX-License-Identifier: Apache-2.0
"""
Latched topics read by publish time (replay/latched.py), in the recorder's bag as written and as a kill leaves it.

The fast test of what a late-matching recorder does to an export and a replay is in test_bag_export.py.
"""

from __future__ import annotations

import time

from hypothesis import given, settings, strategies as st
from mcap.reader import make_reader
from rclpy.serialization import serialize_message
from std_msgs.msg import String

from vla_policy_node.replay.bag import read_messages
from vla_policy_node.replay.latched import in_force
from vla_policy_node.replay.recording import Recording
from vla_policy_node.replay.recording_bag import RecordingBag
from vla_policy_node.replay.recovery import summary_start

TOPICS = [('/instruction', 'std_msgs/msg/String'), ('/joints', 'std_msgs/msg/String')]
S = 10**9


def raw(text: str) -> bytes:
    data = serialize_message(String(data=text))
    return data[:4 + 4 + len(text) + 1]


times = st.integers(0, 100)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(times, times), max_size=12).map(lambda m: sorted(m, key=lambda x: x[0])), times)
def test_what_applies_never_goes_back_in_time_or_publication(messages, start):
    applied = in_force(messages, start)
    indexes = [index for _, index in applied]
    assert len(set(indexes)) == len(indexes)
    assert [t for t, _ in applied] == sorted(t for t, _ in applied)
    at = [min(published, log_time) for log_time, published in messages]     # a later publish time: another clock
    assert [at[index] for index in indexes] == sorted(at[index] for index in indexes)  # never an older after a newer
    for t, index in applied:
        log_time, _ = messages[index]
        assert t == min(log_time, max(at[index], start))    # at its publication; never before the start or after
    left_out = set(range(len(messages))) - set(indexes)
    assert all(at[index] < max(at[i] for i in indexes) for index in left_out)  # only stale messages are left out


def test_a_publisher_whose_clock_is_ahead_never_makes_later_messages_stale():
    """Published "a day after" it arrived: taken at its arrival, and the next message still applies."""
    day = 86_400 * S
    assert in_force([(10 * S, 10 * S + day), (20 * S, 15 * S)], 0) == [(10 * S, 0), (15 * S, 1)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(times, times).map(lambda m: (max(m), min(m))), max_size=12).map(sorted), times)
def test_on_one_clock_every_message_applies_in_publication_order_from_the_start(messages, start):
    """Published no later than received (one clock): all apply, at their publication, or the start if before it."""
    messages = [(max(log_time, start), published) for log_time, published in messages]
    applied = in_force(messages, start)
    assert len(applied) == len(messages)
    assert [messages[index][1] for _, index in applied] == sorted(published for _, published in messages)
    assert [t for t, _ in applied] == sorted(max(published, start) for _, published in messages)


def test_the_recorder_keeps_arrival_order_in_the_file_and_a_killed_bag_reads_by_publication(tmp_path):
    """
    The goal's instruction, published as the recording starts, arrives 0.2 s later; one latched before, at 0.5 s.

    The file holds both in arrival order (an unindexed file must be in log-time order); read, both apply from the
    start (the latched ones first at a tie), in the order published: the old one never follows the goal's.
    """
    folder = tmp_path / 'bag'
    folder.mkdir()
    start = 100 * S
    clock = [start]
    recording = Recording(RecordingBag(folder, TOPICS), [name for name, _ in TOPICS], lambda: clock[0])
    sent = [(0.0, 1, 'joints 0', 0), (0.2, 0, 'put it in the box', 0.0), (0.5, 0, 'pick up the red cube', -60.0),
            (0.6, 1, 'joints 1', 0)]
    for arrival, topic, text, published in sent:
        clock[0] = start + int(arrival * S)
        recording.put(topic, raw(text), published=start + int(published * S) if topic == 0 else 0)
    deadline = time.monotonic() + 5.0
    while recording.counts[1].written < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)                                          # a chunk is closed 0.2 s after its first message
    killed = tmp_path / 'killed'
    killed.mkdir()
    for path in folder.iterdir():
        (killed / path.name).write_bytes(path.read_bytes())
    recording.close()
    for bag in (folder, killed):
        file = next(bag.glob('*.mcap'))
        assert (summary_start(file) == 0) == (bag == killed)   # the kill left no index: read in file order
        with open(file, 'rb') as stream:
            records = [(m.log_time, m.publish_time) for _, _, m in make_reader(stream).iter_messages(
                log_time_order=False)]
        assert records == [(start, start), (start + S // 5, start), (start + S // 2, start - 60 * S),
                           (start + 6 * S // 10, start + 6 * S // 10)]
        assert [(msg.data, t - start) for _, _, msg, t in read_messages(bag, latched={'/instruction'})] == [
            ('pick up the red cube', 0), ('put it in the box', 0), ('joints 0', 0), ('joints 1', 6 * S // 10)]
