# SPDX-License-Identifier: Apache-2.0
"""
``vla_policy_server``: one policy serving chunk requests of any number of robots over DDS.

Robots run ``vla_policy_node`` with ``inference: remote``; each keeps its control loop and
every safety decision (deadline, staleness, episodes, limits) on board. This node only
computes: it decodes requests from ``~/requests`` (wire format: ``ros/server/protocol.py``), hands
them to the ROS-free :class:`BatchServer`, which runs every request waiting when it is free
as one batch (continuous batching: one prefix pass, one denoising loop), and publishes
each answer on ``~/chunks``. A heartbeat on ``~/heartbeat`` every ``heartbeat_period`` seconds
lets robots see at once that the server is gone (killed, stopped, unreachable) and move to
another. /diagnostics reports batches, mean and largest batch size,
queue wait and the policy's latencies, at WARN while requests are refused or batches fail.

A request is refused with a fault answer (so the robot holds with the reason at once, not
after its deadline) when it is malformed but its key (robot, session, ids, observation time)
can still be read, when its joint names are not the server's ``joint_names`` (in order: actions would drive
the wrong joints), or when it sends a camera the server's ``camera_names`` does not list. A
robot sending fewer cameras is served with the missing ones masked, as the node does, and
logged once per session. Every answer carries the digest of the exact request bytes it
answers and exactly the ``horizon`` steps the robot asked for.

A robot's session is served only from the DDS publisher it started with
(``server/sessions.py``): a copy of its request re-published by another participant (a forged
state under its key) is dropped unanswered and counted (``foreign_requests``). Requests queue
one per publisher, so requests under a robot's name from another session never replace the
robot's own. Memory is bounded by bytes (``batch.max_queued_mib``, ``server/batching.py``). With
``fleet_key_file``, only signed requests are served and answers and heartbeats are signed.

Parameters: the policy ones of ``vla_policy_node`` (``checkpoint``, ``allow_random_weights``,
``device``, ``dtype``, ``tiny_model.*``, ``camera_names``, ``joint_names``, ...; the same
parameter file works) and ``batch.window``, ``batch.max_size``, ``batch.max_queued_mib``,
``heartbeat_period``, ``fleet_key_file``.
"""

from __future__ import annotations

import atexit
from collections.abc import MutableMapping
from dataclasses import dataclass, field, replace
import os
import secrets
import tempfile
import time

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
import numpy as np
from rclpy.exceptions import ParameterException, ParameterUninitializedException
from rclpy.node import Node

from vla_policy_node.server.batching import BatchConfig, BatchServer, MIB, ServedChunk, ServedRequest
from vla_policy_node.server.fleet_key import FleetKeyError, load_fleet_key, request_digest
from vla_policy_node.server.sessions import SessionTable
from vla_policy_node.control.inference import FAULT_RAISED, POLICY_STAGES
from vla_policy_node.runtime.shape_buckets import batch_buckets
from vla_policy_node.ros.diagnostics import status_prefix
from vla_policy_node.ros.params import (check_random_weights, ParameterError, ParamSpec, policy_settings_fields,
                                        PolicySettings, SPECS)
from vla_policy_node.ros.policy_loader import make_policy
from vla_policy_node.ros.process import run_until_signal
from vla_policy_node.ros.qos import DIAGNOSTICS_QOS, HEARTBEAT_QOS, MAX_ROBOTS, REMOTE_FLEET_QOS
from vla_policy_node.ros.server.protocol import (ANSWER_TYPE, CHUNKS_TOPIC, decode_request, decode_request_key,
                                                 encode_chunk, encode_heartbeat, HEARTBEAT_TOPIC, ProtocolError,
                                                 Reply, REQUEST_TYPE, REQUESTS_TOPIC, seal, SignatureError)
from vla_policy_node.ros.server.senders import subscribe

NODE_NAME = 'vla_policy_server'
POLICY_PARAMETERS = ('checkpoint', 'allow_random_weights', 'checkpoint_root', 'device', 'dtype',
                     'cuda_graphs', 'compile', 'compile_cache_dir', 'trace', 'num_threads', 'tiny_model.chunk_size',
                     'tiny_model.num_steps', 'tiny_model.seed', 'camera_names', 'joint_names',
                     'diagnostics_period')
SERVER_PARAMETERS = (
    ParamSpec('batch.window', 0.0, 'Seconds a request reaching an idle server waits for others to '
              'share its batch. 0: continuous batching, a free server starts at once with every '
              'request waiting (one prefix pass, one denoising loop).', bounds=(0.0, 1.0)),
    ParamSpec('batch.max_size', 16, 'Most requests in one batch. With cuda_graphs or compile, graphs or '
              'programs are built in the warm-up for batches of 1, 2, 4, ... and this size; a batch '
              'runs padded to the smallest that holds it.', bounds=(1, MAX_ROBOTS)),
    ParamSpec('batch.max_queued_mib', 1024, 'MiB the requests waiting and being served may hold (decoded '
              'images included); past it the largest waiting request is refused with a fault.',
              bounds=(1, 1 << 20)),
    ParamSpec('heartbeat_period', 0.1, 'Seconds between heartbeats on ~/heartbeat; robots count the '
              'server lost after their remote.server_timeout without one.', bounds=(0.01, 5.0)),
    ParamSpec('fleet_key_file', '', 'File holding the fleet key shared with the robots (their '
              'remote.fleet_key_file): only requests signed with it are served, answers and heartbeats '
              'are signed. Empty: no key.'),
)


@dataclass(frozen=True, kw_only=True)
class ServerSettings(PolicySettings):
    """What ``make_policy`` reads (``PolicySettings``) and the batching settings."""

    diagnostics_period: float
    batch_window: float
    batch_max_size: int
    batch_max_queued_mib: int
    heartbeat_period: float
    fleet_key: bytes | None = field(default=None, repr=False)


def declare_server_parameters(node: Node) -> ServerSettings:
    """Declare the server's parameters and return them checked; raises ParameterError."""
    values = {}
    for spec in [SPECS[name] for name in POLICY_PARAMETERS] + list(SERVER_PARAMETERS):
        try:
            node.declare_parameter(spec.name, spec.default, spec.descriptor())
            values[spec.name] = node.get_parameter(spec.name).value
        except ParameterUninitializedException as error:
            raise ParameterError(
                f"parameter '{spec.name}' is required: it {spec.requirement()}") from error
        except ParameterException as error:
            raise ParameterError(f"parameter '{spec.name}' {spec.requirement()}") from error
        if spec.choices and values[spec.name] not in spec.choices:
            raise ParameterError(f"parameter '{spec.name}' {spec.requirement()}")
    check_random_weights(values)
    for name in ('camera_names', 'joint_names'):
        if not values[name] or len(set(values[name])) != len(values[name]):
            raise ParameterError(f"parameter '{name}' must list distinct names")
    try:
        fleet_key = load_fleet_key(values['fleet_key_file']) if values['fleet_key_file'] else None
    except FleetKeyError as error:
        raise ParameterError(f"parameter 'fleet_key_file': {error}") from error
    return ServerSettings(
        **policy_settings_fields(values), diagnostics_period=values['diagnostics_period'],
        batch_window=values['batch.window'], batch_max_size=values['batch.max_size'],
        batch_max_queued_mib=values['batch.max_queued_mib'], heartbeat_period=values['heartbeat_period'],
        fleet_key=fleet_key)


class PolicyServerNode(Node):
    """Decodes requests, batches them through one policy, publishes every answer."""

    def __init__(self) -> None:
        super().__init__(NODE_NAME)
        self._settings = declare_server_parameters(self)
        self._policy = make_policy(self._settings, self.get_logger().info, self.get_logger().warning,
                                   batch_sizes=batch_buckets(self._settings.batch_max_size))
        self._bad_requests = 0
        self._foreign_requests = 0
        self._sessions = SessionTable()
        self._beat_number = 0
        self._troubles_reported = 0
        self._chunks = self.create_publisher(ANSWER_TYPE, f'~/{CHUNKS_TOPIC}', REMOTE_FLEET_QOS)
        self._diagnostics = self.create_publisher(DiagnosticArray, '/diagnostics', DIAGNOSTICS_QOS)
        self._server = BatchServer(self._policy, self._answer, BatchConfig(
            self._settings.batch_window, self._settings.batch_max_size, MAX_ROBOTS,
            self._settings.batch_max_queued_mib * MIB))
        # Raw: decode_request deserializes, so bytes that are not a request are refused, not raised.
        subscribe(self, REQUEST_TYPE, f'~/{REQUESTS_TOPIC}', self._on_request, REMOTE_FLEET_QOS, raw=True)
        self.create_timer(self._settings.diagnostics_period, self._publish_diagnostics)
        self._instance = secrets.token_hex(8)
        self._heartbeats = self.create_publisher(DiagnosticStatus, f'~/{HEARTBEAT_TOPIC}', HEARTBEAT_QOS)
        self._server.start()
        self.create_timer(self._settings.heartbeat_period, self._beat)
        window = self._settings.batch_window
        self.get_logger().info(
            f'ready: serving {self._policy.describe()} on {self.get_fully_qualified_name()}/'
            f'{REQUESTS_TOPIC}, ' + (f'batch window {window * 1e3:g} ms' if window else 'continuous batching'))

    def _beat(self) -> None:
        """Tell robots this server runs (only while its batching thread does)."""
        if self._server.alive:
            self._heartbeats.publish(encode_heartbeat(self.get_fully_qualified_name(), self._instance,
                                                      self._settings.heartbeat_period, self._server.queued,
                                                      self._beat_number, self._settings.fleet_key))
            self._beat_number += 1

    def _on_request(self, msg: bytes, sender: bytes | None) -> None:
        digest = request_digest(msg)
        budget = self._settings.batch_max_queued_mib * MIB
        try:
            if len(msg) > budget:
                raise ProtocolError(f'{len(msg)} bytes, more than batch.max_queued_mib ({budget // MIB} MiB)')
            request = decode_request(msg, self._settings.fleet_key)
        except SignatureError as error:     # not of the fleet: nobody to answer
            self._bad_requests += 1
            self.get_logger().warning(f'request refused: {error}', throttle_duration_sec=2.0)
            return
        except ProtocolError as error:
            self._refuse(msg, None, f'malformed request: {error}', digest, sender)
            return
        key = request.reply_to.key
        if not self._sessions.admit(key.robot, key.session, (sender or b'').hex(), time.monotonic()):
            self._foreign_requests += 1
            self.get_logger().warning(
                f'dropped a request under {key.robot} (session {key.session[:8]}) from a publisher other than '
                'the one that session started with', throttle_duration_sec=5.0)
            return
        problem = self._mismatch(request)
        if problem is not None:
            self._refuse(msg, request, problem, digest, sender)
            return
        # One request waits per publisher: another's requests under this robot's name never replace its own.
        client = sender.hex() if sender else f'{key.robot}\0{key.session}'
        self._server.submit(replace(request, client=client, reply_to=replace(request.reply_to, digest=digest)))

    def _mismatch(self, request: ServedRequest) -> str | None:
        """Why this server must not serve the request's robot, or None."""
        settings = self._settings
        joints, key = request.reply_to.joints, request.reply_to.key
        if joints != settings.joint_names:
            return (f'the robot sends joints {list(joints)} but the server serves '
                    f'joint_names {list(settings.joint_names)} (same names, same order)')
        unknown = sorted(set(request.observation['images']) - set(settings.camera_names))
        if unknown:
            return f'cameras {unknown} are not in the server\'s camera_names {list(settings.camera_names)}'
        missing = sorted(set(settings.camera_names) - set(request.observation['images']))
        if missing and self._sessions.note_once(key.robot, key.session):
            self.get_logger().warning(f'{key.robot} sends no {missing}: served with them masked')
        return None

    def _refuse(self, msg: bytes, request: ServedRequest | None, problem: str, digest: bytes,
                sender: bytes | None) -> None:
        """
        Count and log a refused request; answer it with the reason where its key can be read.

        Not answered: one under a session another publisher started.
        """
        self._bad_requests += 1
        self.get_logger().warning(f'request refused: {problem}', throttle_duration_sec=2.0)
        try:
            key = request.reply_to.key if request is not None else decode_request_key(msg)
        except ProtocolError:
            return              # not even a key: nobody to answer
        if not self._sessions.admit(key.robot, key.session, (sender or b'').hex(), time.monotonic()):
            return
        self._publish_answer(Reply(key, digest), None, FAULT_RAISED, f'request refused: {problem}')

    def _answer(self, served: ServedChunk) -> None:
        reply, chunk, fault, error = served.request.reply_to, served.chunk, served.fault, served.error
        if chunk is not None and len(chunk) < reply.horizon:
            chunk, fault, error = None, FAULT_RAISED, (f'the policy\'s chunk has {len(chunk)} steps, the robot asks '
                                                       f'for {reply.horizon} (its chunking.horizon)')
        self._publish_answer(reply, None if chunk is None else chunk[:reply.horizon], fault, error,
                             served.queue_wait, served.compute, served.batch_size)

    def _publish_answer(self, reply: Reply, chunk: np.ndarray | None, fault: str | None, error: str,
                        queue_wait: float = 0.0, compute: float = 0.0, batch_size: int = 0) -> None:
        self._chunks.publish(seal(encode_chunk(reply.key, reply.digest, chunk, fault, error, queue_wait, compute,
                                               batch_size), self._settings.fleet_key))

    @property
    def serving(self) -> bool:
        """Tell whether the batching thread runs."""
        return self._server.alive

    def _publish_diagnostics(self) -> None:
        stats = self._server.stats
        policy = self._policy.stats
        values = {**stats['counters'], 'bad_requests': self._bad_requests,
                  'foreign_requests': self._foreign_requests, 'sessions': len(self._sessions),
                  'queued_mib': f'{self._server.held_bytes / MIB:.1f}',
                  'mean_batch_size': f"{stats['mean_batch_size']:.3f}",
                  'max_batch_size': stats['max_batch_size'],
                  'queue_wait_mean_ms': f"{stats['queue_wait'][0] * 1e3:.2f}",
                  'queue_wait_p95_ms': f"{stats['queue_wait'][1] * 1e3:.2f}"}
        for stage in POLICY_STAGES:
            p50, p95 = policy.latency(stage)
            values[f'batch_{stage}_latency_p50_ms'] = f'{p50 * 1e3:.2f}'
            values[f'batch_{stage}_latency_p95_ms'] = f'{p95 * 1e3:.2f}'
        counters = stats['counters']
        troubles = (self._bad_requests + counters['batch_faults'] + counters['refused_requests']
                    + counters['answer_errors'])
        level = DiagnosticStatus.OK if troubles == self._troubles_reported else DiagnosticStatus.WARN
        self._troubles_reported = troubles
        array = DiagnosticArray()
        array.header.stamp = self.get_clock().now().to_msg()
        name = status_prefix(self.get_fully_qualified_name())
        array.status.append(DiagnosticStatus(
            level=level, name=f'{name}: server', hardware_id=name,
            message=f'serving, {counters["batches"]} batches'
                    + ('' if level == DiagnosticStatus.OK else
                       ': requests refused, batches failed or answers unsent since the last report'),
            values=[KeyValue(key=key, value=str(value)) for key, value in values.items()]))
        self._diagnostics.publish(array)

    def stop(self) -> bool:
        """Stop serving (and beating) after the running batch; True when it has finished."""
        return self._server.stop(timeout=5.0)


def main() -> int:
    """Run the server until SIGINT/SIGTERM; exit 1 on a configuration error (``ros.process.run_until_signal``)."""
    release_reader_memory(os.environ)
    return run_until_signal(PolicyServerNode, lambda node: node.serving, NODE_NAME)


# rmw_fastrtps keeps each reader's sample buffers for reuse (PREALLOCATED_WITH_REALLOC): after a
# burst of large requests the server would hold a few frames' worth for good. Its readers free
# them instead (DYNAMIC); writers keep rmw_fastrtps' defaults. ROS QoS set in code still apply.
FASTDDS_PROFILE = """<?xml version="1.0" encoding="UTF-8"?>
<dds xmlns="http://www.eprosima.com/XMLSchemas/fastRTPS_Profiles">
  <profiles>
    <data_writer profile_name="vla_policy_server writers" is_default_profile="true">
      <qos><publishMode><kind>ASYNCHRONOUS</kind></publishMode></qos>
      <historyMemoryPolicy>PREALLOCATED_WITH_REALLOC</historyMemoryPolicy>
    </data_writer>
    <data_reader profile_name="vla_policy_server readers" is_default_profile="true">
      <historyMemoryPolicy>DYNAMIC</historyMemoryPolicy>
    </data_reader>
  </profiles>
</dds>
"""
FASTDDS_SETTINGS = ('FASTDDS_DEFAULT_PROFILES_FILE', 'FASTRTPS_DEFAULT_PROFILES_FILE', 'RMW_FASTRTPS_USE_QOS_FROM_XML')


def release_reader_memory(environ: MutableMapping[str, str]) -> str | None:
    """
    Make Fast DDS free the server's received samples once taken; return the profile file, or None.

    Only with rmw_fastrtps and when the user configures none of it (their profile wins); must run
    before the first node is created.
    """
    if environ.get('RMW_IMPLEMENTATION', 'rmw_fastrtps_cpp') not in ('rmw_fastrtps_cpp', 'rmw_fastrtps_dynamic_cpp'):
        return None
    if any(name in environ for name in FASTDDS_SETTINGS):
        return None
    handle, path = tempfile.mkstemp(prefix='vla_policy_server_fastdds_', suffix='.xml')
    with os.fdopen(handle, 'w') as profile:
        profile.write(FASTDDS_PROFILE)
    atexit.register(os.remove, path)
    environ.update(FASTDDS_DEFAULT_PROFILES_FILE=path, FASTRTPS_DEFAULT_PROFILES_FILE=path,
                   RMW_FASTRTPS_USE_QOS_FROM_XML='1')
    return path
