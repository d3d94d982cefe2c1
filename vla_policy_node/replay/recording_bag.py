# SPDX-License-Identifier: Apache-2.0
"""
The recorder's bag: a rosbag2 folder (``metadata.yaml`` and one MCAP file) that a crash leaves readable.

An MCAP chunk is closed, with its message indexes, in one write once it holds ``CHUNK_BYTES``
or ``FLUSH_PERIOD`` after its first message, so a killed process leaves every message older
than that in the file, and that write ends the file as a closed one (``EndedFile``), so
readers open it as it is; the file is fsync'ed every ``SYNC_PERIOD`` (what a power loss can
take). ``metadata.yaml`` is written when the bag opens and rewritten atomically at every sync,
so the folder is a rosbag2 bag from the start. The file's summary is written when the bag is
closed; a file whose end a crash broke (``recovery.close_unfinished``) is cut after its last
complete chunk and ended, which ``vla-policy-replay`` does by itself. Chunks are not compressed: the
frames are most of the bytes, and compressing them would take CPU from the node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import os
from pathlib import Path
import time

from mcap.writer import CompressionType, Writer
from rosbags.typesys import get_typestore, Stores
import yaml

from vla_policy_node.replay.bag import message_definition, register_definition
from vla_policy_node.replay.recovery import close_unfinished, contents, END, Recovered, replace_text

CHUNK_BYTES = 1 << 20
FLUSH_PERIOD = 0.2
SYNC_PERIOD = 1.0


def type_hashes(type_names: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Map each ``pkg/msg/Type`` to (rosbag2's stored definition, its RIHS01 type hash)."""
    typestore = get_typestore(Stores.ROS2_KILTED)
    definitions = {name: message_definition(name) for name in type_names}
    for name, definition in definitions.items():
        register_definition(typestore, name, definition)
    return {name: (definitions[name], typestore.hash_rihs01(name)) for name in type_names}


class EndedFile:
    """
    A file that ends like a closed MCAP file between writes: readers open it even if its writer is killed.

    Bytes written are held until :meth:`flush`, which writes them and a provisional end (a data end
    and a footer without summary, ``recovery.END``) in one ``pwrite``; the next flush overwrites that
    end. A process killed between flushes leaves a file every reader opens as it is; one killed
    inside a flush's write (or a power loss) leaves an unfinished file for ``recovery``.
    """

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self._offset = 0            # where the held bytes go; the provisional end starts here
        self._held: list[bytes] = []
        self.held_bytes = 0

    def write(self, data: bytes) -> int:
        """Hold ``data`` for the next flush."""
        self._held.append(bytes(data))
        self.held_bytes += len(data)
        return len(data)

    def tell(self) -> int:
        """Offset the next byte will have in the file."""
        return self._offset + self.held_bytes

    def flush(self, end: bytes = END) -> None:
        """Write the held bytes and ``end`` at once (OSError: disk full, file-size limit)."""
        data = memoryview(b''.join(self._held) + end)
        offset = self._offset
        while data:
            written = os.pwrite(self._fd, data, offset)
            data, offset = data[written:], offset + written
        self._offset += self.held_bytes
        self._held.clear()
        self.held_bytes = 0

    def finish(self) -> None:
        """Write the held bytes (the writer's own summary and footer) with no provisional end; fsync; close."""
        self.flush(end=b'')
        os.ftruncate(self._fd, self._offset)
        os.fsync(self._fd)
        self.close()

    def fileno(self) -> int:
        """Return the file descriptor (for fsync)."""
        return self._fd

    def close(self) -> None:
        """Close without writing what is held."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


class RecordingBag:
    """Append messages (serialized CDR) of fixed topics to a new rosbag2 folder's MCAP file."""

    def __init__(self, folder: Path, topics: Sequence[tuple[str, str]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``folder`` exists and is empty; ``topics``: (name, ``pkg/msg/Type``), in channel order."""
        self.folder = folder
        self.path = folder / f'{folder.name}_0.mcap'
        self._clock = clock
        self._stream = EndedFile(self.path)
        self._writer = Writer(self._stream, chunk_size=CHUNK_BYTES, compression=CompressionType.NONE)
        self._writer.start(profile='ros2', library='vla-policy-record')
        hashes = type_hashes(sorted({type_name for _, type_name in topics}))
        schemas = {name: self._writer.register_schema(name, 'ros2msg', definition.encode())
                   for name, (definition, _) in hashes.items()}
        self._topics = list(topics)
        self._hashes = {name: rihs for name, (_, rihs) in hashes.items()}
        self._channels = [self._writer.register_channel(topic, 'cdr', schemas[type_name], {
            'offered_qos_profiles': '', 'topic_type_hash': self._hashes[type_name]}) for topic, type_name in topics]
        self.counts = [0] * len(topics)
        self._times: list[int] = []
        self._chunk_since: float | None = None
        self._synced = clock()
        self._writer.flush()
        self._write_metadata()

    def write(self, topic: int, log_time: int, raw: bytes, publish_time: int | None = None) -> None:
        """
        Append one message of topic number ``topic``; OSError if it fails.

        Log times (arrival) must not decrease: an unindexed file is read in file order. ``publish_time``
        (default: the log time) may be in any order.
        """
        self._writer.add_message(self._channels[topic], log_time, raw,
                                 log_time if publish_time is None else publish_time, self.counts[topic])
        self.counts[topic] += 1
        self._times = [self._times[0] if self._times else log_time, log_time]
        self._chunk_since = self._clock() if self._chunk_since is None else self._chunk_since
        if self._stream.held_bytes:         # a chunk closed at CHUNK_BYTES: to the file at once
            self._stream.flush()

    def tick(self) -> None:
        """Close the chunk once it is ``FLUSH_PERIOD`` old; fsync and rewrite the metadata every ``SYNC_PERIOD``."""
        now = self._clock()
        if self._chunk_since is not None and now - self._chunk_since >= FLUSH_PERIOD:
            self._writer.flush()
            self._chunk_since = None
        if now - self._synced >= SYNC_PERIOD:
            self._writer.flush()
            self._chunk_since = None
            os.fsync(self._stream.fileno())
            self._write_metadata()
            self._synced = now

    def close(self) -> None:
        """Write the summary and footer, and the final metadata (OSError if the disk refuses)."""
        self._writer.finish()
        self._stream.finish()
        self._write_metadata()

    def abandon(self) -> Recovered:
        """After a failed write (disk full): end the file after its last complete chunk; what it holds."""
        self._stream.close()        # what it could not write is the unfinished chunk the recovery cuts
        return close_unfinished(self.path) or contents(self.path)

    def _write_metadata(self) -> None:
        start, end = self._times or [0, 0]
        count = sum(self.counts)
        info = {
            'version': 9, 'storage_identifier': 'mcap', 'relative_file_paths': [self.path.name],
            'duration': {'nanoseconds': end - start}, 'starting_time': {'nanoseconds_since_epoch': start},
            'message_count': count,
            'topics_with_message_count': [
                {'topic_metadata': {'name': topic, 'type': type_name, 'serialization_format': 'cdr',
                                    'offered_qos_profiles': [], 'type_description_hash': self._hashes[type_name]},
                 'message_count': self.counts[i]} for i, (topic, type_name) in enumerate(self._topics)],
            'compression_format': '', 'compression_mode': '',
            'files': [{'path': self.path.name, 'starting_time': {'nanoseconds_since_epoch': start},
                       'duration': {'nanoseconds': end - start}, 'message_count': count}],
            'custom_data': None, 'ros_distro': os.environ.get('ROS_DISTRO', 'kilted')}
        replace_text(self.folder / 'metadata.yaml',
                     yaml.safe_dump({'rosbag2_bagfile_information': info}, sort_keys=False))
