# SPDX-License-Identifier: Apache-2.0
"""
Which bag storage loses least when the recorder is killed, and what each sustains.

A child process writes the recorder's load (two 640x480 rgb8 frames at 30 Hz, joint states at
200 Hz: serialized bytes of those sizes) on schedule, printing its count after every write; the
parent SIGKILLs it ``--seconds`` plus a random part of a second later and counts what
``rosbags`` reads from the bag as the kill left it, and after ``vla-policy-replay``'s recovery
(an MCAP file whose end is broken is cut after its last complete chunk and ended). Lost =
written before the kill - readable. Storages:

* ``mcap``: this recorder's (``RecordingBag``: chunks closed every 0.2 s, each write ending the file,
  fsync every 1 s);
* ``mcap-1MiB``: the same with chunks closed only at 1 MiB (as rosbags' writer, the recorder's before);
* ``sqlite3``: rosbag2's sqlite3 schema, WAL journal, a commit every 0.2 s (rosbag2's "resilient"
  preset); ``sqlite3-at-close``: one transaction, committed at close (rosbags' sqlite3 writer).

Then each writes unpaced for ``--seconds`` and closes: the MB/s it sustains.

Run: ``python -m benchmarks.record_storage [--seconds 3] [--kills 3]``.
"""

from __future__ import annotations

import argparse
import itertools
import random
from pathlib import Path
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

FRAME, JOINTS = 640 * 480 * 3 + 60, 300          # bytes of a serialized rgb8 frame and joint state
COMMIT_PERIOD = 0.2
STORAGES = ('mcap', 'mcap-1MiB', 'sqlite3', 'sqlite3-at-close')
SCHEMA = '''
CREATE TABLE topics(id INTEGER PRIMARY KEY, name TEXT NOT NULL, type TEXT NOT NULL,
  serialization_format TEXT NOT NULL, offered_qos_profiles TEXT NOT NULL, type_description_hash TEXT NOT NULL);
CREATE TABLE messages(id INTEGER PRIMARY KEY, topic_id INTEGER NOT NULL, timestamp INTEGER NOT NULL,
  data BLOB NOT NULL);
CREATE INDEX timestamp_idx ON messages (timestamp ASC);
'''


class Sqlite3Bag:
    """rosbag2's sqlite3 tables; a commit every ``period`` s (None: only at close)."""

    def __init__(self, folder: Path, period: float | None) -> None:
        folder.mkdir()
        self.path = folder / f'{folder.name}_0.db3'
        self.connection = sqlite3.connect(self.path, isolation_level='DEFERRED')
        if period is not None:
            self.connection.execute('PRAGMA journal_mode=WAL')
            self.connection.execute('PRAGMA synchronous=NORMAL')
        self.connection.executescript(SCHEMA)
        for i, (name, kind) in enumerate([('/frames', 'sensor_msgs/msg/Image'),
                                          ('/joints', 'sensor_msgs/msg/JointState')]):
            self.connection.execute('INSERT INTO topics VALUES (?, ?, ?, ?, ?, ?)', (i + 1, name, kind, 'cdr', '', ''))
        self.connection.commit()
        self.period, self.committed = period, time.monotonic()

    def write(self, topic: int, log_time: int, data: bytes) -> None:
        self.connection.execute('INSERT INTO messages (topic_id, timestamp, data) VALUES (?, ?, ?)',
                                (topic + 1, log_time, data))

    def tick(self) -> None:
        if self.period is not None and time.monotonic() - self.committed >= self.period:
            self.connection.commit()
            self.committed = time.monotonic()

    def close(self) -> None:
        self.connection.commit()
        self.connection.close()


def open_bag(storage: str, folder: Path):
    """Return a bag with write(topic, log_time, data), tick(), close()."""
    if storage.startswith('sqlite3'):
        return Sqlite3Bag(folder, COMMIT_PERIOD if storage == 'sqlite3' else None)
    from vla_policy_node.replay import recording_bag
    if storage == 'mcap-1MiB':
        recording_bag.FLUSH_PERIOD = recording_bag.SYNC_PERIOD = float('inf')
    folder.mkdir()
    return recording_bag.RecordingBag(folder, [('/frames', 'sensor_msgs/msg/Image'),
                                               ('/joints', 'sensor_msgs/msg/JointState')])


def child(storage: str, folder: Path, seconds: float, paced: bool, cameras: bool = True) -> None:
    """Write the load (paced: on its schedule; without cameras: joint states only) and print the count after each."""
    bag = open_bag(storage, folder)
    frame, joints = bytes(FRAME), bytes(JOINTS)
    schedule = sorted([(k / 200.0, 1) for k in range(int(seconds * 200))]
                      + [(k / 30.0, 0) for k in range(int(seconds * 30)) for _ in range(2 if cameras else 0)])
    start = time.monotonic()
    unpaced = ((0.0, 0 if k % 9 < 2 else 1) for k in itertools.count())     # the same mix of sizes
    for count, (at, topic) in enumerate(schedule if paced else unpaced, 1):
        if paced:
            time.sleep(max(0.0, start + at - time.monotonic()))
        elif time.monotonic() - start > seconds:
            break
        bag.write(topic, time.time_ns(), frame if topic == 0 else joints)
        bag.tick()
        print(count, flush=True)
    bag.close()
    print(f'closed {time.monotonic() - start:.3f}', flush=True)


def readable(storage: str, folder: Path) -> tuple[int, int]:
    """Messages a reader gets from the bag as the kill left it, and after ending an unclosed MCAP file."""
    if storage.startswith('sqlite3'):
        (path,) = folder.glob('*.db3')
        try:
            with sqlite3.connect(path) as connection:
                count = connection.execute('SELECT COUNT(*) FROM messages').fetchone()[0]
        except sqlite3.DatabaseError:
            count = 0
        return count, count
    from rosbags.highlevel import AnyReader

    from vla_policy_node.replay.bag import end_unfinished

    def count() -> int:
        try:
            with AnyReader([folder]) as reader:
                return sum(1 for _ in reader.messages())
        except Exception:  # noqa: B902 - an unreadable bag keeps nothing
            return 0
    as_left = count()
    try:
        end_unfinished(folder)
    except ValueError:
        return as_left, 0
    return as_left, count()


def killed(storage: str, seconds: float, root: Path, cameras: bool) -> tuple[int, int, int]:
    """Write paced, SIGKILL after ``seconds``; return (written before the kill, readable as left, after recovery)."""
    folder = root / 'bag'
    process = subprocess.Popen([sys.executable, '-m', 'benchmarks.record_storage', '--child', storage, str(folder),
                                str(seconds + 30), 'paced' if cameras else 'joints'], stdout=subprocess.PIPE, text=True)
    time.sleep(seconds + random.uniform(0.0, 1.0))        # any moment of the flush and sync periods
    process.send_signal(signal.SIGKILL)
    lines = process.communicate()[0].split()
    return (int(lines[-1]) if lines else 0), *readable(storage, folder)


def throughput(storage: str, seconds: float, root: Path) -> float:
    """MB/s written unpaced for ``seconds``, closing included."""
    folder = root / 'fast'
    output = subprocess.run([sys.executable, '-m', 'benchmarks.record_storage', '--child', storage, str(folder),
                             str(seconds), 'unpaced'], stdout=subprocess.PIPE, text=True, check=True).stdout.split()
    size = sum(path.stat().st_size for path in folder.iterdir())
    return size / 1e6 / float(output[-1])


def main() -> None:
    """Kill each storage's writer ``--kills`` times; print messages lost and MB/s."""
    if len(sys.argv) > 1 and sys.argv[1] == '--child':
        child(sys.argv[2], Path(sys.argv[3]), float(sys.argv[4]), sys.argv[5] != 'unpaced', sys.argv[5] == 'paced')
        return
    parser = argparse.ArgumentParser(description=__doc__.strip().split('\n\n')[0])
    parser.add_argument('--seconds', type=float, default=3.0)
    parser.add_argument('--kills', type=int, default=3)
    args = parser.parse_args()
    print(f"{'storage':<17} {'cameras+joints: written':>23} {'lost as left':>12} {'after recovery':>14} {'(ms)':>5}  "
          f"{'joints only: written':>20} {'lost as left':>12} {'after recovery':>14} {'(ms)':>5} {'MB/s':>6}")
    for storage in STORAGES:
        row = f'{storage:<17}'
        for cameras, rate, width in ((True, 260, 23), (False, 200, 20)):
            results = []
            for _ in range(args.kills):
                with tempfile.TemporaryDirectory(prefix='record_storage_') as root:
                    results.append(killed(storage, args.seconds, Path(root), cameras))
            written = sum(result[0] for result in results) / len(results)
            as_left = written - sum(result[1] for result in results) / len(results)
            lost = written - sum(result[2] for result in results) / len(results)
            row += f' {written:>{width}.0f} {as_left:>12.0f} {lost:>14.0f} {1000 * lost / rate:>5.0f} '
        with tempfile.TemporaryDirectory(prefix='record_storage_') as root:
            print(f'{row}{throughput(storage, args.seconds, Path(root)):>6.0f}', flush=True)


if __name__ == '__main__':
    main()
