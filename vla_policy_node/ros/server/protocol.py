# SPDX-License-Identifier: Apache-2.0
"""
The robot <-> ``vla_policy_server`` wire format: a topic pair of ``std_msgs/UInt8MultiArray``.

Topics (relative to the server's name, default ``/vla_policy_server``): robots publish
requests on ``<server>/requests``; the server answers every robot on ``<server>/chunks``,
and each robot keeps the answers addressed to it (``robot`` = its fully qualified node name)
whose ``session``, ``request_id``, ``episode`` and ``obs_time`` (the :class:`RequestKey`,
returned untouched) are those of the request it awaits. ``session`` is drawn at random when a
robot's remote client starts, so an answer to a request of an earlier run of the same robot
(whose ids started from 0 too) is never taken for an answer of this one.

A message is a list of named segments: ``layout.dim[i].label`` names segment ``i`` and
``layout.dim[i].size`` gives its length in bytes; ``data`` is the segments end to end. The
first segment, ``meta``, is UTF-8 JSON; ``ros2 topic echo --no-arr`` shows the segment list.

Request segments: ``meta`` = ``{"version": 2, "robot", "session", "request_id", "episode",
"obs_time", "deadline": null | seconds the robot waits, "joints": [J names], "task",
"state": [D floats], "images": {camera: [H, W]}, "rtc": null | {"shape": [K, A], "delay_steps",
"max_guidance_weight", "guidance"}}``; ``image/<camera>``: rgb8 rows, H * W * 3 bytes;
``rtc_prefix``: the committed actions, K * A little-endian float64.

Chunk segments: ``meta`` = ``{"version": 2, "robot", "session", "request_id", "episode",
"obs_time", "fault": null | str, "error", "shape": [T, A], "queue_wait", "compute", "batch_size"}``
(seconds); ``chunk``: T * A little-endian float32 (absent with a fault).

Heartbeats: each server publishes a ``diagnostic_msgs/DiagnosticStatus`` on
``<server>/heartbeat`` every ``heartbeat_period`` seconds: ``name`` = the server's node name,
``hardware_id`` = its run (drawn at start), values ``period`` and ``queued`` (requests waiting).
Robots count a server as lost when its heartbeats stop (``server.pool``).

Why a topic pair and not a service: request ids give what a service would (which answer
belongs to which request) without a blocking call, and one answer topic carries a whole batch.
The segments predate the project's generated interface package (vla_policy_interfaces); typed
messages there would replace this module's encoders and decoders only. Floats in JSON
round-trip exactly (repr); times are the robot's own clock, returned untouched. No torch here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
import json
import math
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
from std_msgs.msg import MultiArrayDimension, UInt8MultiArray

from vla_policy_node.control.chunking import RTC_GUIDANCE, RTCGuidance

VERSION = 2
REQUESTS_TOPIC = 'requests'
CHUNKS_TOPIC = 'chunks'
HEARTBEAT_TOPIC = 'heartbeat'
MAX_CAMERA_PIXELS = 4096 * 4096
MAX_META_BYTES = 1 << 20        # a task, a state and a few shapes: far below; bounds json.loads


class ProtocolError(ValueError):
    """A message that does not follow the wire format; the text names the field."""


@dataclass(frozen=True)
class RequestKey:
    """What names a request on the wire; the server returns it untouched with the answer."""

    robot: str          # the robot node's fully qualified name
    session: str        # drawn when the robot's client starts: ids of earlier runs never match
    request_id: int
    episode: int
    obs_time: float     # the robot's clock; the server never reads it

    def meta(self) -> dict[str, Any]:
        """Return the key as meta fields."""
        return {'robot': self.robot, 'session': self.session, 'request_id': int(self.request_id),
                'episode': int(self.episode), 'obs_time': float(self.obs_time)}


@dataclass(frozen=True)
class WireRequest:
    """A decoded request: its key, the robot's joint names, the observation and RTC guidance."""

    key: RequestKey
    joints: tuple[str, ...]
    observation: dict[str, Any]     # images {camera: (H, W, 3) uint8}, state (D,) float32, task
    rtc: RTCGuidance | None
    deadline: float | None = None   # seconds the robot waits for the answer


@dataclass(frozen=True)
class ChunkAnswer:
    """A decoded answer: chunk (T, A) float64 or None with ``fault``; the server's timings."""

    key: RequestKey
    chunk: np.ndarray | None
    fault: str | None
    error: str
    queue_wait: float
    compute: float
    batch_size: int


def topic(server: str, name: str) -> str:
    """Join the server's node name and a topic name: ``/vla_policy_server/requests``."""
    return f"{server.rstrip('/')}/{name}"


def _pack(meta: dict[str, Any], segments: Sequence[tuple[str, bytes]]) -> UInt8MultiArray:
    parts = [('meta', json.dumps(meta).encode())] + list(segments)
    msg = UInt8MultiArray()
    msg.layout.dim = [MultiArrayDimension(label=label, size=len(data), stride=0)
                      for label, data in parts]
    msg.data = b''.join(data for _, data in parts)
    return msg


def _unpack(msg: UInt8MultiArray, any_version: bool = False) -> tuple[dict[str, Any], dict[str, memoryview]]:
    data = memoryview(msg.data).cast('B')
    segments, offset = {}, 0
    for dim in msg.layout.dim:
        if offset + dim.size > len(data):
            raise ProtocolError(f'segment {dim.label!r} runs past the end of data')
        segments[dim.label] = data[offset:offset + dim.size]
        offset += dim.size
    if offset != len(data) or 'meta' not in segments:
        raise ProtocolError('layout.dim must describe data exactly, starting with a meta segment')
    if len(segments['meta']) > MAX_META_BYTES:
        raise ProtocolError(f'meta is {len(segments["meta"])} bytes, more than {MAX_META_BYTES}')
    try:
        meta = json.loads(bytes(segments.pop('meta')))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ProtocolError(f'meta is not JSON: {error}') from error
    if not isinstance(meta, dict):
        raise ProtocolError('meta must be a JSON object')
    if not any_version and meta.get('version') != VERSION:
        raise ProtocolError(f'meta.version must be {VERSION}, got {meta.get("version")!r}')
    return meta, segments


def _field(meta: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = meta.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ProtocolError(f'meta.{name} is missing or not {kind}')
    return value


def _finite(meta: dict[str, Any], name: str) -> float:
    value = float(_field(meta, name, (int, float)))
    if not math.isfinite(value):
        raise ProtocolError(f'meta.{name} must be finite')
    return value


# ---------------------------------------------------------------------- requests
def encode_request(key: RequestKey, joints: Sequence[str], observation: dict[str, Any],
                   rtc: RTCGuidance | None, deadline: float | None = None) -> UInt8MultiArray:
    """Build a request from the loop's observation (images, state, task) and the chunk request."""
    images = {name: np.ascontiguousarray(rgb, dtype=np.uint8)
              for name, rgb in observation['images'].items()}
    meta = {'version': VERSION, **key.meta(), 'deadline': deadline, 'joints': list(joints),
            'task': observation['task'],
            'state': [float(x) for x in np.asarray(observation['state']).ravel()],
            'images': {name: list(rgb.shape[:2]) for name, rgb in images.items()}, 'rtc': None}
    segments = [(f'image/{name}', rgb.tobytes()) for name, rgb in images.items()]
    if rtc is not None:
        prefix = np.ascontiguousarray(rtc.prefix, dtype='<f8')
        meta['rtc'] = {'shape': list(prefix.shape), 'delay_steps': int(rtc.delay_steps),
                       'max_guidance_weight': float(rtc.max_guidance_weight),
                       'guidance': rtc.guidance, 'execution_horizon': rtc.execution_horizon}
        segments.append(('rtc_prefix', prefix.tobytes()))
    return _pack(meta, segments)


def _decoded(decode: Callable[[UInt8MultiArray], Any], msg: UInt8MultiArray) -> Any:
    """
    Run ``decode``; whatever hostile bytes provoke in it is a ProtocolError, never a crash.

    Valid JSON can still be deeply nested (RecursionError), hold a 5,000-digit integer
    (ValueError), a number beyond float (OverflowError) or a list of the wrong things (TypeError).
    """
    try:
        return decode(msg)
    except ProtocolError:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError, KeyError, AttributeError) as error:
        raise ProtocolError(f'malformed message: {type(error).__name__}: {str(error)[:200]}') from error


def decode_request(msg: UInt8MultiArray) -> WireRequest:
    """Decode a request; ProtocolError if malformed."""
    return _decoded(_decode_request, msg)


def decode_request_key(msg: UInt8MultiArray) -> RequestKey:
    """
    Read only the key of a request, whatever its version; ProtocolError if even that is missing.

    The server answers a request it refuses with a fault under this key, so the robot learns
    why at once instead of waiting out its deadline.
    """
    return _decoded(lambda m: _key(_unpack(m, any_version=True)[0]), msg)


def _key(meta: dict[str, Any]) -> RequestKey:
    return RequestKey(robot=_field(meta, 'robot', str), session=_field(meta, 'session', str),
                      request_id=_field(meta, 'request_id', int), episode=_field(meta, 'episode', int),
                      obs_time=_finite(meta, 'obs_time'))


def _decode_request(msg: UInt8MultiArray) -> WireRequest:
    meta, segments = _unpack(msg)
    key = _key(meta)
    joints = _field(meta, 'joints', list)
    if not joints or not all(isinstance(name, str) and name for name in joints):
        raise ProtocolError('meta.joints must be a list of joint names')
    task = _field(meta, 'task', str)
    state = _field(meta, 'state', list)
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in state):
        raise ProtocolError('meta.state must be a list of finite numbers')
    state = np.asarray(state, dtype=np.float64)
    if state.ndim != 1 or not np.isfinite(state).all():
        raise ProtocolError('meta.state must be a list of finite numbers')
    images = {}
    for name, size in _field(meta, 'images', dict).items():
        if (not isinstance(size, list) or len(size) != 2
                or not all(isinstance(n, int) and n > 0 for n in size)
                or size[0] * size[1] > MAX_CAMERA_PIXELS):
            raise ProtocolError(f'meta.images[{name!r}] must be [H, W], positive, at most '
                                f'{MAX_CAMERA_PIXELS} pixels')
        raw = segments.get(f'image/{name}')
        if raw is None or len(raw) != size[0] * size[1] * 3:
            raise ProtocolError(f'segment image/{name} must hold {size[0]} x {size[1]} x 3 bytes')
        images[name] = np.frombuffer(raw, np.uint8).reshape(size[0], size[1], 3)
    rtc = None
    spec = meta.get('rtc')
    if spec is not None:
        rtc = _decode_rtc(spec, segments.get('rtc_prefix'))
    deadline = None
    if meta.get('deadline') is not None:
        deadline = _finite(meta, 'deadline')
        if deadline <= 0:
            raise ProtocolError('meta.deadline must be null or > 0 s')
    observation = {'images': images, 'state': state.astype(np.float32), 'task': task}
    return WireRequest(key, tuple(joints), observation, rtc, deadline)


def _decode_rtc(spec: Any, raw: memoryview | None) -> RTCGuidance:
    if not isinstance(spec, dict):
        raise ProtocolError('meta.rtc must be null or an object')
    shape = _field(spec, 'shape', list)
    if len(shape) != 2 or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ProtocolError('meta.rtc.shape must be [K, A]')
    if raw is None or len(raw) != shape[0] * shape[1] * 8:
        raise ProtocolError(f'segment rtc_prefix must hold {shape[0]} x {shape[1]} float64')
    prefix = np.frombuffer(raw, '<f8').reshape(shape).astype(np.float64)
    delay = _field(spec, 'delay_steps', int)
    if not 0 <= delay <= shape[0]:
        raise ProtocolError(f'meta.rtc.delay_steps must be in [0, {shape[0]}]')
    weight = _finite(spec, 'max_guidance_weight')
    guidance = _field(spec, 'guidance', str)
    if guidance not in RTC_GUIDANCE or weight <= 0 or not np.isfinite(prefix).all():
        raise ProtocolError(f'meta.rtc: guidance one of {RTC_GUIDANCE}, max_guidance_weight > 0 '
                            'and a finite prefix are required')
    horizon = spec.get('execution_horizon')
    if horizon is not None and not (isinstance(horizon, int) and not isinstance(horizon, bool) and horizon >= 1):
        raise ProtocolError('meta.rtc.execution_horizon must be null or an integer >= 1')
    prefix.setflags(write=False)
    return RTCGuidance(prefix, delay, weight, guidance, horizon)


# ---------------------------------------------------------------------- answers
def encode_chunk(key: RequestKey, chunk: np.ndarray | None, fault: str | None, error: str,
                 queue_wait: float = 0.0, compute: float = 0.0, batch_size: int = 0) -> UInt8MultiArray:
    """Build the answer to one request: the chunk (T, A), or a fault with its reason."""
    meta = {'version': VERSION, **key.meta(), 'fault': fault, 'error': error, 'shape': None,
            'queue_wait': queue_wait, 'compute': compute, 'batch_size': batch_size}
    segments = []
    if chunk is not None:
        data = np.ascontiguousarray(chunk, dtype='<f4')
        meta['shape'] = list(data.shape)
        segments.append(('chunk', data.tobytes()))
    return _pack(meta, segments)


def decode_chunk(msg: UInt8MultiArray) -> ChunkAnswer:
    """Decode an answer; ProtocolError if malformed."""
    return _decoded(_decode_chunk, msg)


def _decode_chunk(msg: UInt8MultiArray) -> ChunkAnswer:
    meta, segments = _unpack(msg)
    fault = meta.get('fault')
    chunk = None
    if fault is None:
        shape = _field(meta, 'shape', list)
        raw = segments.get('chunk')
        if (len(shape) != 2 or not all(isinstance(n, int) and n > 0 for n in shape)
                or raw is None or len(raw) != shape[0] * shape[1] * 4):
            raise ProtocolError('meta.shape must be [T, A] and segment chunk hold T x A float32')
        chunk = np.frombuffer(raw, '<f4').reshape(shape).astype(np.float64)
    elif not isinstance(fault, str):
        raise ProtocolError('meta.fault must be null or a string')
    return ChunkAnswer(
        key=_key(meta), chunk=chunk,
        fault=fault, error=str(meta.get('error', '')), queue_wait=_finite(meta, 'queue_wait'),
        compute=_finite(meta, 'compute'), batch_size=_field(meta, 'batch_size', int))


# ---------------------------------------------------------------------- heartbeats
def encode_heartbeat(server: str, instance: str, period: float, queued: int) -> DiagnosticStatus:
    """Build one heartbeat of the server run ``instance``."""
    return DiagnosticStatus(level=DiagnosticStatus.OK, name=server, message='serving', hardware_id=instance,
                            values=[KeyValue(key='period', value=f'{period:g}'),
                                    KeyValue(key='queued', value=str(queued))])


def decode_heartbeat(msg: DiagnosticStatus) -> str:
    """Return the server run a heartbeat comes from; ProtocolError without one."""
    if not msg.hardware_id:
        raise ProtocolError('a heartbeat names its server run in hardware_id')
    return msg.hardware_id
