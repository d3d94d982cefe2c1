# SPDX-License-Identifier: Apache-2.0
"""
What binds an answer to its request and, with a shared fleet key, every message to the fleet.

* :func:`request_digest`: SHA-256 of a request's exact serialized bytes (key, state,
  images, task, guidance, signature). The server returns it with the answer and a robot takes
  an answer only when it is its own request's: an answer to a forged copy of the request (the
  same key, another state) is never taken for the robot's own.
* The optional fleet key (:func:`load_fleet_key`: a file, never a parameter value, since a
  command line is readable by every user of the machine) signs requests, answers and
  heartbeats with HMAC-SHA256 (:func:`sign`, :func:`verified`); each kind of message signs
  under its own label, so a signature of one kind never passes for another. With a key set,
  robots and servers refuse anything unsigned or badly signed.

A digest says which request an answer answers, not who wrote it: anyone who reads the request
can compute it. Who wrote it is the DDS publisher (``ros/server/senders.py``) or, with the
key, the signature. Plain Python: no ROS.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path
import stat

DIGEST_SIZE = 32
SIGNATURE_SIZE = 32             # HMAC-SHA256
MIN_KEY_BYTES = 16              # 128 bits
REQUEST, ANSWER, HEARTBEAT = b'vla-request', b'vla-answer', b'vla-heartbeat'


class FleetKeyError(ValueError):
    """A fleet key file that cannot be used; the text says why and how to make one."""


def request_digest(serialized: bytes) -> bytes:
    """Return the digest of a request's serialized bytes, as the answer must carry it."""
    return hashlib.sha256(serialized).digest()     # SHA-NI / ARMv8 SHA: ~1 ms for two 640x480 frames


def load_fleet_key(path: str) -> bytes:
    """
    Read the fleet key from ``path``: its bytes, surrounding whitespace stripped.

    Refused: a missing, unreadable or short file (fewer than 16 bytes), and one that every
    user of the machine may read or write (the key would be everyone's).
    """
    make = f'(make one: openssl rand -hex 32 > {path} && chmod 600 {path})'
    try:
        mode = os.stat(path).st_mode
        key = Path(path).read_bytes().strip()
    except OSError as error:
        raise FleetKeyError(f'fleet key file {path!r} cannot be read: {error.strerror} {make}') from error
    if not stat.S_ISREG(mode):
        raise FleetKeyError(f'fleet key file {path!r} is not a regular file')
    if mode & (stat.S_IROTH | stat.S_IWOTH):
        raise FleetKeyError(f'fleet key file {path!r} is readable or writable by every user: chmod o-rw {path}')
    if len(key) < MIN_KEY_BYTES:
        raise FleetKeyError(f'fleet key file {path!r} holds {len(key)} bytes, at least {MIN_KEY_BYTES} '
                            f'are needed {make}')
    return key


def sign(key: bytes, label: bytes, data: bytes) -> bytes:
    """Return the HMAC-SHA256 of ``data`` under ``key`` for messages of kind ``label``."""
    return hmac.new(key, label + b'\0' + data, hashlib.sha256).digest()


def verified(key: bytes, label: bytes, data: bytes, signature: bytes) -> bool:
    """Tell whether ``signature`` is the fleet's signature of ``data`` (constant time)."""
    return len(signature) == SIGNATURE_SIZE and hmac.compare_digest(sign(key, label, data), bytes(signature))
