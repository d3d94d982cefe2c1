# SPDX-License-Identifier: Apache-2.0
"""
The robot <-> vla_policy_server wire format (``ros/server/protocol.py``) without DDS.

Round trips of requests and answers, as messages and as the serialized bytes the raw
subscriptions hand over, and hostile messages: each must be a ProtocolError naming what is
wrong, on either side, never an exception of another kind and never a decoded value.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from rclpy.serialization import deserialize_message, serialize_message
from vla_policy_interfaces.msg import ActionChunk, CameraFrame, PolicyRequest, RTCGuidance as RTCMsg

from vla_policy_node.control.chunking import RTCGuidance
from vla_policy_node.ros.conversions import rgb_to_image
from vla_policy_node.ros.server.protocol import (decode_chunk, decode_heartbeat, decode_request, decode_request_key,
                                                 encode_chunk, encode_heartbeat, encode_request, MAX_TEXT,
                                                 ProtocolError, Reply, RequestKey, seal, SignatureError, VERSION)

JOINTS = ('a', 'b', 'c')
TASK = 'stack the blocks'
RGB = np.arange(48 * 64 * 3, dtype=np.uint8).reshape(48, 64, 3)
STATE = np.array([0.1, -0.2, 0.3])
KEY = RequestKey('/arm1/vla_policy_node', 'abc', 3, 2, 12.5)
PREFIX = np.arange(12, dtype=np.float64).reshape(4, 3) / 7


def request(rtc: bool = True) -> PolicyRequest:
    return encode_request(KEY, JOINTS, {'images': {'front': RGB}, 'state': STATE, 'task': TASK},
                          RTCGuidance(PREFIX, 2, 5.0, 'lerobot', 3) if rtc else None, deadline=0.4, horizon=8)


DIGEST = bytes(range(32))


def answer() -> ActionChunk:
    return encode_chunk(KEY, DIGEST, np.arange(24, dtype=np.float64).reshape(8, 3) / 3, None, '', 0.001, 0.01, 4)


def test_the_version_is_the_message_definitions_and_was_bumped():
    assert VERSION == PolicyRequest.VERSION == 4


@pytest.mark.parametrize('serialized', [False, True], ids=['message', 'bytes'])
def test_a_request_round_trips(serialized):
    msg = request()
    decoded = decode_request(serialize_message(msg) if serialized else msg)
    assert decoded.reply_to == Reply(KEY, joints=JOINTS, horizon=8) and decoded.deadline == 0.4
    np.testing.assert_array_equal(decoded.observation['images']['front'], RGB)
    np.testing.assert_allclose(decoded.observation['state'], STATE.astype(np.float32))
    assert decoded.observation['state'].dtype == np.float32 and decoded.observation['task'] == TASK
    rtc = decoded.rtc
    np.testing.assert_array_equal(rtc.prefix, PREFIX)
    assert (rtc.delay_steps, rtc.max_guidance_weight, rtc.guidance, rtc.execution_horizon) == (2, 5.0, 'lerobot', 3)
    assert not rtc.prefix.flags.writeable
    plain = decode_request(encode_request(KEY, JOINTS, {'images': {}, 'state': STATE, 'task': TASK}, None))
    assert plain.rtc is None and plain.deadline is None and plain.observation['images'] == {}


@pytest.mark.parametrize('serialized', [False, True], ids=['message', 'bytes'])
def test_an_answer_round_trips_and_a_fault_carries_no_chunk(serialized):
    msg = answer()
    decoded = decode_chunk(serialize_message(msg) if serialized else msg)
    assert decoded.request.reply_to == Reply(KEY, DIGEST) and decoded.fault is None and decoded.error == ''
    np.testing.assert_allclose(decoded.chunk, np.arange(24).reshape(8, 3) / 3, rtol=1e-6)
    assert decoded.chunk.dtype == np.float64
    assert (decoded.queue_wait, decoded.compute, decoded.batch_size) == (0.001, 0.01, 4)

    fault = decode_chunk(encode_chunk(KEY, DIGEST, np.zeros((8, 3)), 'raised', 'boom', 0.0, 0.1, 2))
    assert fault.chunk is None and fault.fault == 'raised' and fault.error == 'boom' and fault.batch_size == 2


def test_the_key_of_a_request_of_another_version_can_still_be_read():
    """So the server can answer it with the reason instead of leaving the robot to its deadline."""
    msg = request()
    msg.version = 2
    with pytest.raises(ProtocolError, match='version must be 4, got 2'):
        decode_request(msg)
    assert decode_request_key(msg) == KEY
    assert decode_request_key(serialize_message(msg)) == KEY
    msg.key.session = ''
    with pytest.raises(ProtocolError, match='key.session'):
        decode_request_key(msg)


def _image(**fields) -> Callable[[PolicyRequest], None]:
    def change(msg: PolicyRequest) -> None:
        for name, value in fields.items():
            setattr(msg.images[0].image, name, value)
    return change


def _set(path: str, value) -> Callable[[PolicyRequest | ActionChunk], None]:
    def change(msg) -> None:
        *parents, name = path.split('.')
        for parent in parents:
            msg = getattr(msg, parent)[0] if parent == 'rtc' else getattr(msg, parent)
        setattr(msg, name, value)
    return change


def _second_front(msg: PolicyRequest) -> None:
    msg.images = list(msg.images) + [CameraFrame(camera='front', image=rgb_to_image(RGB))]


def _rtc_rows(msg: PolicyRequest) -> None:
    msg.rtc = [RTCMsg(rows=5, cols=3, prefix=PREFIX.ravel().tolist(), delay_steps=1, max_guidance_weight=1.0,
                      guidance='paper')]


NAN, INF = float('nan'), float('inf')
# (what is wrong, how, what the error names)
HOSTILE_REQUESTS = [
    ('another version', _set('version', 7), 'version must be 4, got 7'),
    ('no robot', _set('key.robot', ''), 'key.robot'),
    ('NaN observation time', _set('key.obs_time', NAN), 'key.obs_time must be finite'),
    ('a negative deadline', _set('deadline', -1.0), 'deadline'),
    ('an infinite deadline', _set('deadline', INF), 'deadline must be finite'),
    ('no joints', _set('joints', []), 'joints must be 1 to'),
    ('no horizon', _set('horizon', 0), 'horizon must be 1 to 4096'),
    ('a horizon of 170,000 steps', _set('horizon', 170_000), 'horizon must be 1 to 4096'),
    ('an empty joint name', _set('joints', ['a', '', 'c']), r'joints\[\]'),
    ('fewer state values than joints', _set('state', [0.1, 0.2]), 'state must hold one value per joint'),
    ('a NaN state', _set('state', [0.1, NAN, 0.3]), 'state must be finite'),
    ('an infinite state', _set('state', [0.1, -INF, 0.3]), 'state must be finite'),
    ('a state beyond float32', _set('state', [0.1, 1e300, 0.3]), 'state must be finite'),
    ('a task too long', _set('task', 'x' * (MAX_TEXT + 1)), 'task must be text of at most'),
    ('a task that was not UTF-8', _set('task', 'pick \ufffd up'), 'task is not UTF-8'),
    ('an image too large', _image(height=5000, width=5000, step=15000), 'more than the 16777216 pixels'),
    ('image bytes not its size', _image(height=47), 'image data has 9216 bytes'),
    ('an unknown encoding', _image(encoding='yuv422'), "unsupported image encoding 'yuv422'"),
    ('a depth image', _image(encoding='16UC1'), "unsupported image encoding '16UC1'"),
    ('rows shorter than their pixels', _image(step=64), 'step 64 is smaller'),
    ('an image without pixels', _image(height=0, width=0, step=0, data=b''), 'no pixels'),
    ('a camera sent twice', _second_front, "camera 'front' is sent twice"),
    ('a camera without a name', _set('images', [CameraFrame(camera='', image=rgb_to_image(RGB))]),
     r'images\[\].camera'),
    ('an RTC prefix not its shape', _rtc_rows, 'rtc.prefix must hold rows x cols = 5 x 3 values, got 12'),
    ('a NaN RTC prefix', _set('rtc.prefix', [NAN] * 12), 'rtc.prefix must be finite'),
    ('a delay past the prefix', _set('rtc.delay_steps', 5), r'rtc.delay_steps must be in \[0, 4\]'),
    ('an infinite guidance weight', _set('rtc.max_guidance_weight', INF), 'rtc.max_guidance_weight must be finite'),
    ('a zero guidance weight', _set('rtc.max_guidance_weight', 0.0), 'max_guidance_weight > 0'),
    ('an unknown guidance', _set('rtc.guidance', 'bold'), 'guidance one of'),
    ('a huge RTC prefix', _set('rtc.rows', 1 << 20), 'more than 1048576 values'),
]


@pytest.mark.parametrize('change,reason', [h[1:] for h in HOSTILE_REQUESTS], ids=[h[0] for h in HOSTILE_REQUESTS])
def test_a_hostile_request_is_a_protocol_error_naming_the_field(change, reason):
    msg = request()
    change(msg)
    with pytest.raises(ProtocolError, match=reason):
        decode_request(msg)
    with pytest.raises(ProtocolError, match=reason):        # as the server's raw subscription hands it over
        decode_request(serialize_message(msg))


HOSTILE_ANSWERS = [
    ('another version', _set('version', 2), 'version must be 4, got 2'),
    ('no session', _set('key.session', ''), 'key.session'),
    ('an infinite observation time', _set('key.obs_time', INF), 'key.obs_time must be finite'),
    ('a NaN action', _set('actions', [NAN] * 24), 'actions must be finite'),
    ('an infinite action', _set('actions', [INF] + [0.0] * 23), 'actions must be finite'),
    ('actions not their shape', _set('steps', 9), 'actions must hold steps x action_dim = 9 x 3 values, got 24'),
    ('no chunk and no fault', _set('steps', 0), 'must carry a chunk'),
    ('a fault with a chunk', _set('fault', 'raised'), 'must carry no chunk'),
    ('a NaN queue wait', _set('queue_wait', NAN), 'queue_wait must be finite'),
    ('an infinite compute time', _set('compute', -INF), 'compute must be finite'),
    ('an error that was not UTF-8', _set('error', '\ufffd'), 'error is not UTF-8'),
    ('a huge chunk', _set('steps', 1 << 20), 'more than 1048576 values'),
]


@pytest.mark.parametrize('change,reason', [h[1:] for h in HOSTILE_ANSWERS], ids=[h[0] for h in HOSTILE_ANSWERS])
def test_a_hostile_answer_is_a_protocol_error_naming_the_field(change, reason):
    msg = answer()
    change(msg)
    with pytest.raises(ProtocolError, match=reason):
        decode_chunk(msg)
    with pytest.raises(ProtocolError, match=reason):        # as a robot's raw subscription hands it over
        decode_chunk(serialize_message(msg))


def _not_utf8(raw: bytes, text: str) -> bytes:
    """``raw`` with the bytes of ``text`` overwritten by as many that are not UTF-8."""
    encoded = text.encode()
    assert raw.count(encoded) == 1
    return raw.replace(encoded, b'\xff' * len(encoded))


@pytest.mark.parametrize('side', ['request', 'answer'])
def test_bytes_that_are_not_the_message_are_protocol_errors(side):
    """Truncated or foreign bytes fail in rclpy's deserialization: a ProtocolError, not an RMWError."""
    raw = serialize_message(request() if side == 'request' else answer())
    decode = decode_request if side == 'request' else decode_chunk
    for bad in (raw[:len(raw) // 2], raw[:-3], b'', b'\x00\x01garbage'):
        with pytest.raises(ProtocolError):
            decode(bad)
    with pytest.raises(ProtocolError, match='not UTF-8'):
        decode(_not_utf8(raw, KEY.robot))
    with pytest.raises(ProtocolError, match='PolicyRequest was expected'):
        decode_request(answer())


def test_bytes_of_another_version_are_refused_naming_it():
    """The version is read from the bytes first: another version's fields need not parse as this one's."""
    raw = bytearray(serialize_message(request()))
    raw[4:8] = (3).to_bytes(4, 'little')
    with pytest.raises(ProtocolError, match='version must be 4, got 3'):
        decode_request(bytes(raw))
    assert decode_request_key(bytes(raw)) == KEY


KEY_BYTES = b'k' * 32


@pytest.mark.parametrize('side', ['request', 'answer'])
def test_with_a_fleet_key_only_signed_messages_are_taken(side):
    msg = request() if side == 'request' else answer()
    decode = decode_request if side == 'request' else decode_chunk
    key_of = (lambda decoded: decoded.reply_to.key) if side == 'request' else (
        lambda decoded: decoded.request.reply_to.key)
    with pytest.raises(SignatureError, match='not signed with the fleet key'):
        decode(serialize_message(msg), KEY_BYTES)
    signed = seal(msg, KEY_BYTES)
    assert key_of(decode(signed, KEY_BYTES)) == KEY
    assert key_of(decode(signed)) == KEY, 'without a key, signatures are not read'
    with pytest.raises(SignatureError, match='bad fleet key signature'):
        decode(signed, b'x' * 32)
    tampered = deserialize_message(signed, type(msg))      # the signature of another message's bytes
    tampered.key.request_id += 1
    with pytest.raises(SignatureError, match='bad fleet key signature'):
        decode(serialize_message(tampered), KEY_BYTES)
    with pytest.raises(SignatureError, match='bad fleet key signature'):
        decode(deserialize_message(signed, type(msg)), KEY_BYTES)   # only the bytes received can be checked
    if side == 'answer':        # an answer's signature never passes for a request's, nor the reverse
        copied = request()
        copied.signature = deserialize_message(signed, ActionChunk).signature
        with pytest.raises(SignatureError):
            decode_request(serialize_message(copied), KEY_BYTES)


def test_heartbeats_are_numbered_and_with_a_key_signed():
    beat = encode_heartbeat('/vla_policy_server', 'run1', 0.1, 2, 7, KEY_BYTES)
    assert decode_heartbeat(beat, KEY_BYTES) == ('run1', 7)
    assert decode_heartbeat(encode_heartbeat('/vla_policy_server', 'run1', 0.1, 2, 7)) == ('run1', 7)
    for forged in (encode_heartbeat('/vla_policy_server', 'run1', 0.1, 2, 7),
                   encode_heartbeat('/vla_policy_server', 'run1', 0.1, 2, 7, b'x' * 32)):
        with pytest.raises(SignatureError):
            decode_heartbeat(forged, KEY_BYTES)
    beat.values[2].value = '8'          # a later beat number under an earlier beat's signature
    with pytest.raises(SignatureError):
        decode_heartbeat(beat, KEY_BYTES)


def test_a_heartbeat_without_a_beat_number_is_read_but_never_signed():
    beat = encode_heartbeat('/vla_policy_server', 'run1', 0.1, 2)
    beat.values = [kv for kv in beat.values if kv.key != 'beat']
    assert decode_heartbeat(beat) == ('run1', None)
    with pytest.raises(SignatureError):
        decode_heartbeat(beat, KEY_BYTES)
