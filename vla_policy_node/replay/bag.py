# SPDX-License-Identifier: Apache-2.0
"""
ROS 2 bags, MCAP or sqlite3 (``.db3``), read without a ROS install; written for tests.

Reading uses the ``rosbags`` library: a bag is one ``.mcap`` or ``.db3`` file, or a rosbag2
folder (``metadata.yaml`` beside its files); a folder of ``.mcap`` files without metadata is
read as those files in order. The type definitions stored in the bag decode the CDR messages
(ROS 2 Kilted's, for a type a bag does not define), so no message package needs to be installed.

Writing (:class:`BagWriter`, used by the tests and ``benchmarks/synthetic_bag.py``) serializes with rclpy, as
``ros2 bag record`` does, and stores each type's definition the way rosbag2 does: the
type's ``.msg`` text, then every type it uses after a line of ``=`` and ``MSG: pkg/Type``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
import heapq
import itertools
import os
from pathlib import Path
import re
import sys
from typing import Any

from rosbags.highlevel import AnyReader
from rosbags.typesys import get_typestore, Stores

from vla_policy_node.replay.latched import in_force, publish_times
from vla_policy_node.replay.recovery import close_unfinished, Recovered

PRIMITIVES = {'bool', 'byte', 'char', 'float32', 'float64', 'int8', 'uint8', 'int16', 'uint16',
              'int32', 'uint32', 'int64', 'uint64', 'string', 'wstring'}
SEPARATOR = '=' * 80
STORAGE_SUFFIXES = ('.mcap', '.db3')


def bag_paths(path: str | os.PathLike) -> list[Path]:
    """Return what the reader opens: the file, the rosbag2 folder, or a bare folder's .mcap files in order."""
    path = Path(path)
    if path.is_file() or (path / 'metadata.yaml').is_file():
        return [path]
    files = sorted(path.glob('*.mcap'), key=lambda p: [int(t) if t.isdigit() else t
                                                       for t in re.split(r'(\d+)', p.name)])
    if not files:
        raise FileNotFoundError(f'{path} is neither a bag file ({", ".join(STORAGE_SUFFIXES)}) nor a folder '
                                'holding one')
    return files


def storage_files(path: str | os.PathLike) -> list[Path]:
    """Return the bag's files: the one named, or a folder's ``.mcap`` files."""
    return [p for p in bag_paths(path) for p in ([p] if p.is_file() else sorted(p.glob('*.mcap')))]


def end_unfinished(path: str | os.PathLike) -> list[Recovered]:
    """
    End every MCAP file of the bag that its writer never closed (``recovery``); what each still holds.

    ValueError (BagError) if such a file holds nothing readable.
    """
    recovered = []
    for file in storage_files(path):
        if file.suffix != '.mcap' or not file.stat().st_size:
            continue
        try:
            ended = close_unfinished(file)
        except ValueError as error:
            raise _unreadable(file, error) from error
        if ended is not None:
            recovered.append(ended)
    return recovered


class BagError(ValueError):
    """A bag that cannot be read (truncated, corrupted, not a bag), with the path and the reason."""


def _unreadable(path: Path, error: Exception) -> BagError:
    first = (str(error).strip().splitlines() or [''])[0][:200]
    return BagError(f'{path}: not a readable ROS 2 bag ({type(error).__name__}: {first})')


def _open(path: str | os.PathLike) -> AnyReader:
    """Return an opened reader of the bag; BagError if it cannot be opened."""
    reader = AnyReader(bag_paths(path), default_typestore=get_typestore(Stores.ROS2_KILTED))
    try:
        reader.open()
    except Exception as error:  # noqa: B902 - the readers raise many kinds on hostile bytes
        raise _unreadable(Path(path), error) from error
    return reader


def read_messages(path: str | os.PathLike, topics: set[str] | None = None,
                  latched: Collection[str] = ()) -> Iterator[tuple[str, str, Any, int]]:
    """
    Yield (topic, type name, decoded message, time in ns) in time order.

    The time is the log time, but a ``latched`` topic's message comes when it took effect, by its
    publish time, and not at all if one published after it took effect first (``latched``).
    Whatever the readers raise on a broken bag (a truncated chunk, a corrupted zstd frame,
    garbage after the magic) is a :class:`BagError` naming the bag.
    """
    reader = _open(path)
    try:
        connections = [c for c in reader.connections if topics is None or c.topic in topics]
        held = [c for c in connections if c.topic in latched]
        others = [c for c in connections if c.topic not in latched]
        stream = reader.messages(connections=others) if others else iter(())    # none: rosbags reads all
        if held:
            stream = _with_latched(path, reader, held, stream)
        for connection, time, raw in stream:
            yield connection.topic, connection.msgtype, reader.deserialize(raw, connection.msgtype), time
    except Exception as error:  # noqa: B902 - as in _open
        raise _unreadable(Path(path), error) from error
    finally:
        reader.close()


def _with_latched(path: str | os.PathLike, reader: AnyReader, held: list[Any],
                  stream: Iterator[tuple[Any, int, Any]]) -> Iterator[tuple[Any, int, Any]]:
    """Merge the ``held`` connections' messages that apply, at the times they apply, into the log-time ``stream``."""
    kept = list(reader.messages(connections=held))
    if not kept:
        return stream
    published = publish_times(storage_files(path), {connection.topic for connection, _, _ in kept})
    first = next(stream, None)
    stream = itertools.chain([first], stream) if first is not None else stream
    start = min(kept[0][1], first[1]) if first is not None else kept[0][1]
    order = in_force([(log_time, published.get((connection.topic, log_time, bytes(raw)), log_time))
                      for connection, log_time, raw in kept], start)
    applied = [(kept[index][0], time, kept[index][2]) for time, index in order]
    return heapq.merge(applied, stream, key=lambda message: message[1])     # ties: the latched message first


def topic_types(path: str | os.PathLike) -> dict[str, str]:
    """Map every topic of the bag to its type name (``sensor_msgs/msg/Image``); BagError if unreadable."""
    reader = _open(path)
    try:
        return {connection.topic: connection.msgtype for connection in reader.connections}
    finally:
        reader.close()


def _msg_file(package: str, name: str) -> Path:
    prefixes = [p for p in os.environ.get('AMENT_PREFIX_PATH', '').split(os.pathsep) if p]
    for prefix in prefixes + [sys.prefix]:
        candidate = Path(prefix) / 'share' / package / 'msg' / f'{name}.msg'
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f'no definition of {package}/msg/{name} under AMENT_PREFIX_PATH or {sys.prefix}')


def _used_types(text: str, package: str) -> list[str]:
    used = []
    for line in text.splitlines():
        tokens = line.split('#', 1)[0].split()
        if len(tokens) < 2 or '=' in tokens[1]:        # blank, or a constant
            continue
        kind = re.sub(r'(\[.*\]|<=\d+)$', '', tokens[0])
        if kind in PRIMITIVES or kind.startswith(('string<=', 'wstring<=')):
            continue
        if kind == 'Header':
            kind = 'std_msgs/Header'
        used.append(kind if '/' in kind else f'{package}/{kind}')
    return used


def message_definition(type_name: str) -> str:
    """Return rosbag2's stored definition of ``pkg/msg/Type`` (with the types it uses)."""
    package, _, name = type_name.replace('/msg/', '/').partition('/')
    main = _msg_file(package, name).read_text()
    parts, seen, queue = [main], set(), _used_types(main, package)
    while queue:
        dependency = queue.pop(0)
        if dependency in seen:
            continue
        seen.add(dependency)
        dep_package, _, dep_name = dependency.replace('/msg/', '/').partition('/')
        text = _msg_file(dep_package, dep_name).read_text()
        parts.append(f'{SEPARATOR}\nMSG: {dep_package}/{dep_name}\n{text}')
        queue += _used_types(text, dep_package)
    return '\n'.join(parts)


def register_definition(typestore: Any, type_name: str, definition: str) -> None:
    """Teach a ``rosbags`` typestore a type from rosbag2's stored definition (the types it uses included)."""
    from rosbags.typesys.msg import get_types_from_msg
    parts = definition.split(f'\n{SEPARATOR}\nMSG: ')
    types = get_types_from_msg(parts[0], type_name)
    for part in parts[1:]:
        used, _, text = part.partition('\n')
        package, _, leaf = used.partition('/')
        types.update(get_types_from_msg(text, f'{package}/msg/{leaf}'))
    typestore.register({key: value for key, value in types.items() if key not in typestore.fielddefs})


class BagWriter:
    """Write rclpy messages to an MCAP bag as rosbag2 would (needs rclpy)."""

    def __init__(self, path: str | os.PathLike) -> None:
        from mcap.writer import Writer
        self._stream = open(path, 'wb')
        self._writer = Writer(self._stream)
        self._writer.start(profile='ros2', library='vla_policy_node')
        self._schemas: dict[str, int] = {}
        self._channels: dict[str, int] = {}
        self._typestore = get_typestore(Stores.ROS2_KILTED)

    def write(self, topic: str, msg: Any, log_time_ns: int, publish_time_ns: int | None = None) -> None:
        """Append ``msg`` on ``topic`` logged at ``log_time_ns``, published then too unless ``publish_time_ns``."""
        from rclpy.serialization import serialize_message
        module = type(msg).__module__.split('.')
        type_name = f'{module[0]}/msg/{type(msg).__name__}'
        if type_name not in self._schemas:
            definition = message_definition(type_name)
            self._schemas[type_name] = self._writer.register_schema(type_name, 'ros2msg', definition.encode())
            register_definition(self._typestore, type_name, definition)
        if topic not in self._channels:
            self._channels[topic] = self._writer.register_channel(
                topic, 'cdr', self._schemas[type_name])
        self._writer.add_message(self._channels[topic], log_time_ns, self._exact(serialize_message(msg), type_name),
                                 log_time_ns if publish_time_ns is None else publish_time_ns)

    def _exact(self, raw: bytes, type_name: str) -> bytes:
        """
        Return ``raw`` cut at the message's end, as DDS delivers it and rosbag2 records it.

        rclpy's ``serialize_message`` (Kilted's rmw_fastrtps) may append a few bytes of its buffer
        after the message; strict readers (rosbags) refuse a message with bytes left over.
        """
        msgdef = self._typestore.get_msgdef(type_name)
        _, end = msgdef.deserialize_cdr_le(raw[4:], 0, msgdef.cls, self._typestore)
        return raw[:4 + end]

    def close(self) -> None:
        """Finish the file (summary and index)."""
        self._writer.finish()
        self._stream.close()

    def __enter__(self) -> BagWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
