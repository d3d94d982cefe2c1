# SPDX-License-Identifier: Apache-2.0
"""
Close an MCAP file that its writer never closed (killed, power lost, disk full).

Such a file ends inside a record, with no summary and no footer, and readers refuse it ("File
end magic is invalid"). Every record before that point is intact: the recorder closes a chunk
(and its message indexes) in one write. :func:`close_unfinished` walks the records from the
start, keeps those that are complete (a chunk only if its CRC matches, since after a power loss
the end of a file can be zeros), cuts the file after the last one and appends a data end and a
footer without a summary, which readers handle by scanning the file (``rosbags`` and rosbag2's
MCAP plugin both do). The message counts of the rosbag2 folder's ``metadata.yaml`` are
rewritten to match. Nothing complete is changed: the cut removes only bytes no reader could use.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
import mmap
import os
from pathlib import Path
import struct
import zlib

import yaml

MAGIC = b'\x89MCAP0\r\n'
HEADER, FOOTER, CHANNEL, MESSAGE, CHUNK, DATA_END = 0x01, 0x02, 0x04, 0x05, 0x06, 0x0F
# A data end (its CRC 0: not computed) and a footer with no summary (offsets 0, CRC 0), then the magic.
END = (struct.pack('<BQI', DATA_END, 4, 0) + struct.pack('<BQQQI', FOOTER, 20, 0, 0, 0) + MAGIC)


@dataclass
class Recovered:
    """What an unfinished file held: its complete messages per topic, and the bytes cut."""

    path: Path
    counts: Counter = field(default_factory=Counter)      # topic -> messages
    times: list[int] = field(default_factory=list)        # first and last log time (ns)
    cut_bytes: int = 0

    @property
    def messages(self) -> int:
        """All complete messages kept."""
        return sum(self.counts.values())


def summary_start(path: Path) -> int | None:
    """Return where the file's summary starts, per its footer: 0 if it ended without one, None if it has no end."""
    with open(path, 'rb') as stream:
        size = stream.seek(0, os.SEEK_END)
        if size < 2 * len(MAGIC) + 29:
            return None
        stream.seek(size - 29 - len(MAGIC))
        footer = stream.read()
    if footer[-len(MAGIC):] != MAGIC or footer[:9] != struct.pack('<BQ', FOOTER, 20):
        return None
    return struct.unpack_from('<Q', footer, 9)[0]


class _Scan:
    """The complete records of a file, their channels (topics) and message counts."""

    def __init__(self) -> None:
        self.topics: dict[int, str] = {}
        self.counts: Counter = Counter()
        self.times: list[int] = []
        self.end = 0            # offset just after the last complete record

    def records(self, data: memoryview, start: int, stop: int, top: bool):
        offset = start
        while offset + 9 <= stop:
            opcode, length = struct.unpack_from('<BQ', data, offset)
            body = offset + 9
            if length > stop - body or (top and opcode in (DATA_END, FOOTER)):
                return
            if top and opcode == CHUNK and not self._chunk(data, body, body + length):
                return
            if opcode == CHANNEL:
                channel, _, size = struct.unpack_from('<HHI', data, body)
                self.topics[channel] = bytes(data[body + 8:body + 8 + size]).decode()
            elif opcode == MESSAGE:
                channel, _, log_time = struct.unpack_from('<HIQ', data, body)
                self.counts[self.topics.get(channel, str(channel))] += 1
                self.times = [min(self.times[0], log_time), max(self.times[1], log_time)] if self.times else [
                    log_time, log_time]
            offset = body + length
            if top:
                self.end = offset

    def _chunk(self, data: memoryview, start: int, stop: int) -> bool:
        """Read a complete chunk's records; False if it is corrupt (its CRC) or compressed other than zstd."""
        _, _, size, crc, compression_length = struct.unpack_from('<QQQII', data, start)
        at = start + 32 + compression_length
        compression = bytes(data[start + 32:at])
        if compression not in (b'', b'zstd') or at + 8 > stop:
            return False
        (stored_length,) = struct.unpack_from('<Q', data, at)
        records = data[at + 8:min(stop, at + 8 + stored_length)]
        if compression:
            import zstandard        # rosbags' dependency; only other writers' files are compressed
            try:
                records = memoryview(zstandard.decompress(records, max_output_size=size))
            except zstandard.ZstdError:
                return False
        if len(records) != size or (crc and zlib.crc32(records) != crc):
            return False
        self.records(records, 0, size, top=False)
        return True


def close_unfinished(path: str | os.PathLike) -> Recovered | None:
    """
    End the MCAP file at ``path`` after its last complete record; None if nothing needed doing.

    A file closed with its summary is left alone. One ended without a summary (the recorder's
    provisional end, or an earlier recovery) keeps its bytes; the folder's ``metadata.yaml`` is
    brought to its counts. ValueError if it does not start as an MCAP file.
    """
    path = Path(path)
    start = summary_start(path)
    if start:
        return None
    scan, size = _scan(path)
    ended = start == 0 and size == scan.end + len(END)
    recovered = Recovered(path, scan.counts, scan.times, 0 if ended else size - scan.end)
    if not ended:
        with open(path, 'r+b') as stream:
            stream.truncate(scan.end)
            stream.seek(scan.end)
            stream.write(END)
            stream.flush()
            os.fsync(stream.fileno())
    metadata = path.parent / 'metadata.yaml'
    try:
        updated = metadata.is_file() and write_counts(metadata, recovered)
    except OSError:         # a read-only bag: its file reads as it is, the counts stay stale
        updated = False
    return recovered if updated or not ended else None


def contents(path: str | os.PathLike) -> Recovered:
    """Count the complete messages of an MCAP file per topic, changing nothing (ValueError if it is none)."""
    scan, _ = _scan(Path(path))
    return Recovered(Path(path), scan.counts, scan.times)


def _scan(path: Path) -> tuple[_Scan, int]:
    """Scan the file's records (ValueError if it is no MCAP file); return the scan and the file's size."""
    if path.stat().st_size < len(MAGIC) + 9:
        raise ValueError(f'{path} does not start as an MCAP file (it is {path.stat().st_size} bytes long)')
    scan = _Scan()
    with open(path, 'rb') as stream, mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        with memoryview(mapped) as data:
            if bytes(data[:len(MAGIC)]) != MAGIC or data[len(MAGIC)] != HEADER:
                raise ValueError(f'{path} does not start as an MCAP file')
            scan.records(data, len(MAGIC), len(data), top=True)
            size = len(data)
    if scan.end <= len(MAGIC):
        raise ValueError(f'{path} holds no complete MCAP record')
    return scan, size


def write_counts(metadata: Path, recovered: Recovered) -> bool:
    """Bring a rosbag2 ``metadata.yaml`` to the counts and times of the messages the file holds; True if it changed."""
    text = metadata.read_text()
    document = yaml.safe_load(text)
    info = document['rosbag2_bagfile_information']
    start, end = recovered.times or [0, 0]
    for entry in info['topics_with_message_count']:
        entry['message_count'] = recovered.counts.get(entry['topic_metadata']['name'], 0)
    info['message_count'] = recovered.messages
    info['starting_time'] = {'nanoseconds_since_epoch': start}
    info['duration'] = {'nanoseconds': end - start}
    for entry in info.get('files', []):
        entry.update(message_count=recovered.messages, starting_time=dict(info['starting_time']),
                     duration=dict(info['duration']))
    if yaml.safe_load(text) == document:
        return False
    replace_text(metadata, yaml.safe_dump(document, sort_keys=False))
    return True


def replace_text(path: Path, text: str) -> None:
    """Write ``path`` atomically (a temporary file renamed over it), so a crash leaves the old or the new."""
    temporary = path.with_name(path.name + '.tmp')
    with open(temporary, 'w') as stream:
        stream.write(text)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(temporary, path)
