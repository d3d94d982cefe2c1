# SPDX-License-Identifier: Apache-2.0
"""
The robot <-> ``vla_policy_server`` wire format: a topic pair of ``vla_policy_interfaces`` messages.

Topics (relative to the server's name, default ``/vla_policy_server``): robots publish
``vla_policy_interfaces/msg/PolicyRequest`` on ``<server>/requests``; the server answers every
robot with ``vla_policy_interfaces/msg/ActionChunk`` on ``<server>/chunks``, and each robot
keeps the answers addressed to it (``key.robot`` = its fully qualified node name) whose
``session``, ``request_id``, ``episode`` and ``obs_time`` (the :class:`RequestKey`, returned
untouched) are those of the request it awaits. ``session`` is drawn at random when a robot's
remote client starts, so an answer to a request of an earlier run of the same robot (whose ids
started from 0 too) is never taken for an answer of this one.
``ros2 interface show vla_policy_interfaces/msg/PolicyRequest`` (and ``ActionChunk``) explains
every field; ``ros2 topic echo --no-arr <server>/chunks`` shows the answers.

Request: ``version`` (``PolicyRequest.VERSION``, 4), ``key``, ``deadline`` (seconds the robot
waits, 0: none), ``horizon`` (the steps the answer carries), ``joints`` (J names), ``task``,
``state`` (J floats), ``images`` (one ``CameraFrame`` per camera: its name and a
``sensor_msgs/Image``, rgb8 as robots send it), ``rtc`` (at most one ``RTCGuidance``: the
committed actions, K x A float64 row-major, the delay, the weight, the guidance and its
execution horizon, 0: all) and ``signature``.

Answer: ``version``, ``key``, ``request_digest`` (SHA-256 of the request's serialized bytes),
``fault`` (empty, or why there is no chunk), ``error``, the chunk (``steps`` x ``action_dim``
float32, row-major; empty with a fault), ``queue_wait``, ``compute`` (seconds), ``batch_size``
and ``signature``.

With a shared fleet key (``server/fleet_key.py``) requests, answers and heartbeats carry an
HMAC-SHA256: of the serialized bytes before the signature, the last field (a heartbeat: of its
server, run and beat number); :func:`seal` serializes and signs, the decoders refuse, from
the bytes received, what is unsigned or badly signed. Without a key, signatures are neither
sent nor read.

This module is the only one that knows the layout: the ``encode_*`` functions build messages
from plain values, the ``decode_*`` ones turn a message, or its serialized bytes, into the
types the batch server serves and answers with (``server.batching``: a request's key, joints
and horizon in its :class:`Reply`; an answer's request carries only that) and check what the
types cannot: the version, finite numbers, lengths that agree with the shapes they declare,
image sizes and encodings, a camera named once. Anything else is a :class:`ProtocolError`
naming the field, never an exception of the executor: the node and the robots subscribe to raw
(serialized) messages, so bytes that are not the type (truncated, strings that are not UTF-8)
are refused here too.

Heartbeats: each server publishes a ``diagnostic_msgs/DiagnosticStatus`` on
``<server>/heartbeat`` every ``heartbeat_period`` seconds: ``name`` = the server's node name,
``hardware_id`` = its run (drawn at start), values ``period``, ``queued`` (requests waiting),
``beat`` (counts from 0 in each run: a robot takes only a newer beat of a run) and, with a
fleet key, ``signature``. Robots count a server as lost when its heartbeats stop (``server.pool``).

Why a topic pair and not a service or an action: a robot never blocks on a call (its loop
keeps ticking and the deadline is its own), the request key gives what a service's pairing
would, and one answer topic carries a whole batch. Versions 1 and 2 sent the same fields as
``std_msgs/UInt8MultiArray`` segments with a JSON header; a robot of those versions and a server
of this one do not match on DDS at all (the topic types differ), so the robot sees no server
subscribed and holds at once with that reason. Times are the robot's own clock, returned
untouched. No torch here.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
import math
from typing import Any

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
import numpy as np
from rclpy.serialization import deserialize_message, serialize_message
from vla_policy_interfaces.msg import ActionChunk, CameraFrame, PolicyRequest
from vla_policy_interfaces.msg import RequestKey as KeyMsg, RTCGuidance as RTCMsg

from vla_policy_node.control.chunking import RTC_GUIDANCE, RTCGuidance
from vla_policy_node.ros.conversions import ConversionError, image_to_rgb, rgb_to_image
from vla_policy_node.server.batching import ServedChunk, ServedRequest
from vla_policy_node.server.fleet_key import ANSWER, HEARTBEAT, REQUEST, sign, SIGNATURE_SIZE, verified

VERSION = PolicyRequest.VERSION
REQUESTS_TOPIC = 'requests'
CHUNKS_TOPIC = 'chunks'
HEARTBEAT_TOPIC = 'heartbeat'
REQUEST_TYPE = PolicyRequest        # on <server>/requests
ANSWER_TYPE = ActionChunk           # on <server>/chunks
MAX_CAMERA_PIXELS = 4096 * 4096
MAX_TEXT = 1 << 16          # characters of the task or a name: far above any; bounds what is logged and kept
MAX_JOINTS = 1024
MAX_CHUNK_VALUES = 1 << 20  # steps x action_dim of a chunk or an RTC prefix
MAX_HORIZON = 4096          # steps of a chunk a robot may ask for


class ProtocolError(ValueError):
    """A message that does not follow the wire format; the text names the field."""


class SignatureError(ProtocolError):
    """A message without the fleet key's signature, where a key is set."""


@dataclass(frozen=True)
class RequestKey:
    """What names a request on the wire; the server returns it untouched with the answer."""

    robot: str          # the robot node's fully qualified name
    session: str        # drawn when the robot's client starts: ids of earlier runs never match
    request_id: int
    episode: int
    obs_time: float     # the robot's clock; the server never reads it


@dataclass(frozen=True)
class Reply:
    """
    What a request says of itself, and its answer carries back: the :class:`ServedRequest`'s ``reply_to``.

    digest: of the request's bytes (set by the server on arrival; an answer returns it);
    joints: the robot's joint names; horizon: the steps the answer carries (0 in an answer).
    """

    key: RequestKey
    digest: bytes = b''
    joints: tuple[str, ...] = ()
    horizon: int = 0


def topic(server: str, name: str) -> str:
    """Join the server's node name and a topic name: ``/vla_policy_server/requests``."""
    return f"{server.rstrip('/')}/{name}"


def _decoded(decode: Callable[[Any], Any], msg: Any, msg_type: type) -> Any:
    """
    Run ``decode`` on the message (deserialized first when it comes as bytes): errors are ProtocolErrors.

    rclpy's deserialization raises its own errors on bytes that are not the type; a check that
    misses a case must still refuse the message rather than crash the callback. The version,
    the first field, is read from the bytes first: a message of another version, whose other
    fields need not parse as this one's, is refused naming its version.
    """
    try:
        if isinstance(msg, (bytes, bytearray, memoryview)):
            _check_version(bytes(msg[:8]))
            msg = deserialize_message(bytes(msg), msg_type)
        if not isinstance(msg, msg_type):
            raise ProtocolError(f'a {msg_type.__name__} was expected, got {type(msg).__name__}')
        return decode(msg)
    except ProtocolError:
        raise
    except Exception as error:  # noqa: B902 - rclpy's RMWError, UnicodeDecodeError and whatever a bad buffer provokes
        raise ProtocolError(f'malformed message: {type(error).__name__}: {str(error)[:200]}') from error


def _check_version(head: bytes) -> None:
    """Refuse serialized bytes of another version (CDR: a 4-byte encapsulation, then ``version``)."""
    if len(head) == 8 and head[:2] in (b'\x00\x00', b'\x00\x01'):
        version = int.from_bytes(head[4:], 'big' if head[1] == 0 else 'little')
        if version != VERSION:
            raise ProtocolError(f'version must be {VERSION}, got {version}')


def seal(msg: PolicyRequest | ActionChunk, key: bytes | None) -> bytes:
    """
    Return the message serialized as it goes on the wire, signed with the fleet key when there is one.

    The signature is the last field, so its 32 bytes end the serialized message: they are the
    HMAC of every byte before them, exactly as sent (a serializer need not write padding the
    same way twice, so the bytes are signed, not a re-serialization).
    """
    if key is None:
        return serialize_message(msg)
    msg.signature = bytes(SIGNATURE_SIZE)
    raw = bytearray(serialize_message(msg))
    raw[-SIGNATURE_SIZE:] = sign(key, _label(msg), bytes(raw[:-SIGNATURE_SIZE]))
    return bytes(raw)


def _label(msg: Any) -> bytes:
    return REQUEST if isinstance(msg, PolicyRequest) else ANSWER


def _check_signature(msg: PolicyRequest | ActionChunk, raw: bytes | None, key: bytes | None) -> None:
    """Refuse a message whose bytes ``raw`` are not signed with the fleet key (no key: nothing to check)."""
    if key is None:
        return
    signature = bytes(msg.signature)
    if not signature:
        raise SignatureError('not signed with the fleet key')
    if raw is None or raw[-SIGNATURE_SIZE:] != signature or not verified(key, _label(msg), raw[:-SIGNATURE_SIZE],
                                                                         signature):
        raise SignatureError('bad fleet key signature')


def _text(value: str, field: str, empty: bool = False) -> str:
    """Check a string field; rclpy decodes bytes that are not UTF-8 as U+FFFD, refused here."""
    if len(value) > MAX_TEXT or not (empty or value):
        raise ProtocolError(f'{field} must be {"" if empty else "non-empty "}text of at most {MAX_TEXT} characters')
    if '\ufffd' in value:
        raise ProtocolError(f'{field} is not UTF-8')
    return value


def _finite(value: float, field: str) -> float:
    if not math.isfinite(value):
        raise ProtocolError(f'{field} must be finite, got {value!r}')
    return float(value)


def _matrix(values: Any, rows: int, cols: int, dtype: str, field: str, shape: str) -> np.ndarray:
    """``values`` as a finite (rows, cols) float64 array; ProtocolError naming ``field`` otherwise."""
    if rows * cols > MAX_CHUNK_VALUES:
        raise ProtocolError(f'{field}: {rows} x {cols} is more than {MAX_CHUNK_VALUES} values')
    data = np.asarray(values, dtype=dtype)
    if data.shape != (rows * cols,):
        raise ProtocolError(f'{field} must hold {shape} = {rows} x {cols} values, got {data.size}')
    if not np.isfinite(data).all():
        raise ProtocolError(f'{field} must be finite')
    return data.reshape(rows, cols).astype(np.float64)


# ---------------------------------------------------------------------- keys
def _key_msg(key: RequestKey) -> KeyMsg:
    return KeyMsg(robot=key.robot, session=key.session, request_id=int(key.request_id),
                  episode=int(key.episode), obs_time=float(key.obs_time))


def _key(msg: KeyMsg) -> RequestKey:
    return RequestKey(robot=_text(msg.robot, 'key.robot'), session=_text(msg.session, 'key.session'),
                      request_id=int(msg.request_id), episode=int(msg.episode),
                      obs_time=_finite(msg.obs_time, 'key.obs_time'))


# ---------------------------------------------------------------------- requests
def encode_request(key: RequestKey, joints: Sequence[str], observation: dict[str, Any],
                   rtc: RTCGuidance | None, deadline: float | None = None, horizon: int = 1) -> PolicyRequest:
    """Build a request from the loop's observation (images, state, task) and the chunk request."""
    msg = PolicyRequest(version=VERSION, key=_key_msg(key), deadline=float(deadline or 0.0), horizon=int(horizon),
                        joints=list(joints), task=observation['task'])
    msg.state = array('d', np.ascontiguousarray(observation['state'], dtype=np.float64).tobytes())
    msg.images = [CameraFrame(camera=name, image=rgb_to_image(rgb)) for name, rgb in observation['images'].items()]
    if rtc is not None:
        prefix = np.ascontiguousarray(rtc.prefix, dtype=np.float64)
        msg.rtc = [RTCMsg(rows=prefix.shape[0], cols=prefix.shape[1], prefix=array('d', prefix.tobytes()),
                          delay_steps=int(rtc.delay_steps), max_guidance_weight=float(rtc.max_guidance_weight),
                          guidance=rtc.guidance, execution_horizon=int(rtc.execution_horizon or 0))]
    return msg


def decode_request(msg: PolicyRequest | bytes, key: bytes | None = None) -> ServedRequest:
    """Decode a request (a message or its serialized bytes); ProtocolError if malformed or, with a key, unsigned."""
    raw = bytes(msg) if isinstance(msg, (bytes, bytearray, memoryview)) else None
    return _decoded(lambda m: _decode_request(m, raw, key), msg, PolicyRequest)


def decode_request_key(msg: PolicyRequest | bytes) -> RequestKey:
    """
    Read only the key of a request, whatever its version; ProtocolError if even that is unreadable.

    The server answers a request it refuses with a fault under this key, so the robot learns
    why at once instead of waiting out its deadline.
    """
    try:
        return _decoded(lambda m: _key(m.key), msg, PolicyRequest)
    except ProtocolError:
        if not isinstance(msg, (bytes, bytearray, memoryview)):
            raise
    try:        # another version: its key where this version has it, if its bytes parse as one
        return _key(deserialize_message(bytes(msg), PolicyRequest).key)
    except Exception as error:  # noqa: B902 - as in _decoded
        raise ProtocolError(f'no readable key: {type(error).__name__}') from error


def _decode_request(msg: PolicyRequest, raw: bytes | None, fleet_key: bytes | None) -> ServedRequest:
    if msg.version != VERSION:
        raise ProtocolError(f'version must be {VERSION}, got {msg.version}')
    _check_signature(msg, raw, fleet_key)
    key = _key(msg.key)
    if not 0 < msg.horizon <= MAX_HORIZON:
        raise ProtocolError(f'horizon must be 1 to {MAX_HORIZON} steps, got {msg.horizon}')
    joints = tuple(msg.joints)
    if not 0 < len(joints) <= MAX_JOINTS:
        raise ProtocolError(f'joints must be 1 to {MAX_JOINTS} joint names, got {len(joints)}')
    for name in joints:
        _text(name, 'joints[]')
    task = _text(msg.task, 'task', empty=True)
    state = np.asarray(msg.state, dtype=np.float64)
    if state.shape != (len(joints),):
        raise ProtocolError(f'state must hold one value per joint: {len(joints)} joints, {state.size} values')
    with np.errstate(over='ignore'):
        finite = np.isfinite(state.astype(np.float32)).all()
    if not finite:
        raise ProtocolError('state must be finite (as float32)')
    images = {}
    for frame in msg.images:
        name = _text(frame.camera, 'images[].camera')
        if name in images:
            raise ProtocolError(f'images: camera {name!r} is sent twice')
        try:
            images[name] = image_to_rgb(frame.image, MAX_CAMERA_PIXELS)
        except ConversionError as error:
            raise ProtocolError(f'images[{name!r}]: {error}') from error
    rtc = _decode_rtc(msg.rtc[0]) if msg.rtc else None
    deadline = _finite(msg.deadline, 'deadline')
    if deadline < 0:
        raise ProtocolError('deadline must be 0 (none) or > 0 s')
    observation = {'images': images, 'state': state.astype(np.float32), 'task': task}
    return ServedRequest(key.robot, Reply(key, joints=joints, horizon=int(msg.horizon)), observation, rtc,
                         deadline or None)


def _decode_rtc(msg: RTCMsg) -> RTCGuidance:
    prefix = _matrix(msg.prefix, msg.rows, msg.cols, np.float64, 'rtc.prefix', 'rows x cols')
    if not msg.delay_steps <= msg.rows:
        raise ProtocolError(f'rtc.delay_steps must be in [0, {msg.rows}], got {msg.delay_steps}')
    weight = _finite(msg.max_guidance_weight, 'rtc.max_guidance_weight')
    if msg.guidance not in RTC_GUIDANCE or weight <= 0:
        raise ProtocolError(f'rtc: guidance one of {RTC_GUIDANCE} and max_guidance_weight > 0 are required')
    prefix.setflags(write=False)
    return RTCGuidance(prefix, int(msg.delay_steps), weight, msg.guidance, int(msg.execution_horizon) or None)


# ---------------------------------------------------------------------- answers
def encode_chunk(key: RequestKey, digest: bytes, chunk: np.ndarray | None, fault: str | None, error: str,
                 queue_wait: float = 0.0, compute: float = 0.0, batch_size: int = 0) -> ActionChunk:
    """Build the answer to one request (its key and digest): the chunk (T, A), or a fault with its reason."""
    msg = ActionChunk(version=VERSION, key=_key_msg(key), fault=fault or '', error=error,
                      queue_wait=float(queue_wait), compute=float(compute), batch_size=int(batch_size))
    msg.request_digest = np.frombuffer(digest, dtype=np.uint8)
    if chunk is not None and not fault:
        data = np.ascontiguousarray(chunk, dtype=np.float32)
        msg.steps, msg.action_dim = data.shape
        msg.actions = array('f', data.tobytes())
    return msg


def decode_chunk(msg: ActionChunk | bytes, key: bytes | None = None) -> ServedChunk:
    """Decode an answer (a message or its serialized bytes); ProtocolError if malformed or, with a key, unsigned."""
    raw = bytes(msg) if isinstance(msg, (bytes, bytearray, memoryview)) else None
    return _decoded(lambda m: _decode_chunk(m, raw, key), msg, ActionChunk)


def _decode_chunk(msg: ActionChunk, raw: bytes | None, fleet_key: bytes | None) -> ServedChunk:
    if msg.version != VERSION:
        raise ProtocolError(f'version must be {VERSION}, got {msg.version}')
    _check_signature(msg, raw, fleet_key)
    key = _key(msg.key)
    fault = _text(msg.fault, 'fault', empty=True) or None
    chunk = None
    if fault is None:
        if msg.steps == 0 or msg.action_dim == 0:
            raise ProtocolError('an answer without a fault must carry a chunk: steps and action_dim > 0')
        chunk = _matrix(msg.actions, msg.steps, msg.action_dim, np.float32, 'actions', 'steps x action_dim')
    elif len(msg.actions) or msg.steps or msg.action_dim:
        raise ProtocolError(f'an answer with a fault ({fault!r}) must carry no chunk')
    batch_size = int(msg.batch_size)
    request = ServedRequest(key.robot, Reply(key, bytes(msg.request_digest)), {}, None)
    return ServedChunk(request=request, chunk=chunk, fault=fault, error=_text(msg.error, 'error', empty=True),
                       queue_wait=_finite(msg.queue_wait, 'queue_wait'), compute=_finite(msg.compute, 'compute'),
                       batch_size=batch_size)


# ---------------------------------------------------------------------- heartbeats
def encode_heartbeat(server: str, instance: str, period: float, queued: int, beat: int = 0,
                     key: bytes | None = None) -> DiagnosticStatus:
    """Build heartbeat number ``beat`` of the server run ``instance``, signed with the fleet key if any."""
    values = [KeyValue(key='period', value=f'{period:g}'), KeyValue(key='queued', value=str(queued)),
              KeyValue(key='beat', value=str(beat))]
    if key is not None:
        values.append(KeyValue(key='signature', value=sign(key, HEARTBEAT, _beat_data(server, instance, beat)).hex()))
    return DiagnosticStatus(level=DiagnosticStatus.OK, name=server, message='serving', hardware_id=instance,
                            values=values)


def decode_heartbeat(msg: DiagnosticStatus, key: bytes | None = None) -> tuple[str, int | None]:
    """
    Return (the server run, the beat number) of a heartbeat; ProtocolError without a run or, with a key, unsigned.

    The beat number is None for a heartbeat that carries none (it is then not checked for replays).
    """
    if not msg.hardware_id:
        raise ProtocolError('a heartbeat names its server run in hardware_id')
    values = {kv.key: kv.value for kv in msg.values}
    if key is not None and 'beat' not in values:
        raise SignatureError('heartbeat not signed with the fleet key')
    try:
        beat = int(values['beat']) if 'beat' in values else None
        signature = bytes.fromhex(values.get('signature', ''))
    except ValueError as error:
        raise ProtocolError(f'heartbeat: {error}') from error
    if key is not None and not verified(key, HEARTBEAT, _beat_data(msg.name, msg.hardware_id, beat), signature):
        raise SignatureError('heartbeat not signed with the fleet key')
    return msg.hardware_id, beat


def _beat_data(server: str, instance: str, beat: int) -> bytes:
    return f'{server}\0{instance}\0{beat}'.encode()
