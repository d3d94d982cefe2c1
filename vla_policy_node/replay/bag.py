# SPDX-License-Identifier: Apache-2.0
"""
ROS 2 bags in MCAP (rosbag2's default storage), read without a ROS install; written for tests.

Reading uses the ``mcap`` and ``mcap-ros2-support`` packages: the schemas in the file (the
``ros2msg`` definitions rosbag2 stores) decode the CDR messages, so no message package needs
to be installed. A bag is either one ``.mcap`` file or a rosbag2 folder (``metadata.yaml``
beside ``<name>_0.mcap``, ``<name>_1.mcap``, ... which are read in order).

Writing (:class:`BagWriter`, used by the tests and ``benchmarks/synthetic_bag.py``) serializes with rclpy, as
``ros2 bag record`` does, and stores each type's definition the way rosbag2 does: the
type's ``.msg`` text, then every type it uses after a line of ``=`` and ``MSG: pkg/Type``.
"""

from __future__ import annotations

from collections.abc import Iterator
import os
from pathlib import Path
import re
import sys
from typing import Any

from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory

PRIMITIVES = {'bool', 'byte', 'char', 'float32', 'float64', 'int8', 'uint8', 'int16', 'uint16',
              'int32', 'uint32', 'int64', 'uint64', 'string', 'wstring'}
SEPARATOR = '=' * 80


def bag_files(path: str | os.PathLike) -> list[Path]:
    """Return the MCAP files of a bag: the file itself, or a rosbag2 folder's, in order."""
    path = Path(path)
    if path.is_file():
        return [path]
    files = sorted(path.glob('*.mcap'), key=lambda p: [int(t) if t.isdigit() else t
                                                       for t in re.split(r'(\d+)', p.name)])
    if not files:
        raise FileNotFoundError(f'{path} is neither an .mcap file nor a folder holding some')
    return files


class BagError(ValueError):
    """A bag that cannot be read (truncated, corrupted, not MCAP), with the file and the reason."""


def _unreadable(file: Path, error: Exception) -> BagError:
    first = (str(error).strip().splitlines() or [''])[0][:200]
    return BagError(f'{file}: not a readable MCAP bag ({type(error).__name__}: {first})')


def read_messages(path: str | os.PathLike,
                  topics: set[str] | None = None) -> Iterator[tuple[str, str, Any, int]]:
    """
    Yield (topic, type name, decoded message, log time in ns) in log-time order per file.

    Whatever the MCAP and CDR readers raise on a broken file (a truncated chunk, a corrupted
    zstd frame, garbage after the magic) is a :class:`BagError` naming the file.
    """
    for file in bag_files(path):
        with open(file, 'rb') as stream:
            try:
                reader = make_reader(stream, decoder_factories=[DecoderFactory()])
                for schema, channel, message, decoded in reader.iter_decoded_messages(
                        topics=None if topics is None else sorted(topics), log_time_order=True):
                    yield channel.topic, schema.name, decoded, message.log_time
            except Exception as error:  # noqa: B902 - the readers raise many kinds on hostile bytes
                raise _unreadable(file, error) from error


def topic_types(path: str | os.PathLike) -> dict[str, str]:
    """Map every topic of the bag to its type name (``sensor_msgs/msg/Image``); BagError if unreadable."""
    types = {}
    for file in bag_files(path):
        with open(file, 'rb') as stream:
            try:
                summary = make_reader(stream).get_summary()
            except Exception as error:  # noqa: B902 - as in read_messages
                raise _unreadable(file, error) from error
        if summary is None:
            raise BagError(f'{file}: no summary section: the bag is truncated or was not closed '
                           '(ros2 bag reindex can rebuild it)')
        for channel in summary.channels.values():
            types[channel.topic] = summary.schemas[channel.schema_id].name
    return types


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


class BagWriter:
    """Write rclpy messages to an MCAP bag as rosbag2 would (needs rclpy)."""

    def __init__(self, path: str | os.PathLike) -> None:
        from mcap.writer import Writer
        self._stream = open(path, 'wb')
        self._writer = Writer(self._stream)
        self._writer.start(profile='ros2', library='vla_policy_node')
        self._schemas: dict[str, int] = {}
        self._channels: dict[str, int] = {}

    def write(self, topic: str, msg: Any, log_time_ns: int) -> None:
        """Append ``msg`` on ``topic`` logged at ``log_time_ns``."""
        from rclpy.serialization import serialize_message
        module = type(msg).__module__.split('.')
        type_name = f'{module[0]}/msg/{type(msg).__name__}'
        if type_name not in self._schemas:
            self._schemas[type_name] = self._writer.register_schema(
                type_name, 'ros2msg', message_definition(type_name).encode())
        if topic not in self._channels:
            self._channels[topic] = self._writer.register_channel(
                topic, 'cdr', self._schemas[type_name])
        self._writer.add_message(self._channels[topic], log_time_ns, serialize_message(msg),
                                 log_time_ns)

    def close(self) -> None:
        """Finish the file (summary and index)."""
        self._writer.finish()
        self._stream.close()

    def __enter__(self) -> BagWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
