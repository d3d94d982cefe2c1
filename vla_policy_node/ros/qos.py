# SPDX-License-Identifier: Apache-2.0
"""
One named QoS profile per stream, so publishers and subscribers agree by construction.

Best-effort subscriptions accept both reliable and best-effort publishers, which is why the
high-rate sensor streams use them; the instruction and the commands must not be lost.
"""

from rclpy.qos import (
    DurabilityPolicy,
    HistoryPolicy,
    QoSProfile,
    qos_profile_sensor_data,
    ReliabilityPolicy,
)

# Camera frames: only the newest frame matters and drivers publish best effort.
CAMERA_QOS: QoSProfile = qos_profile_sensor_data

# The node's camera readers: the control tick reads only the newest frame (``PolledSubscription``),
# so a deeper history would copy frames only to drop them. Compatible with CAMERA_QOS.
CAMERA_READER_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=1,
    reliability=ReliabilityPolicy.BEST_EFFORT,
    durability=DurabilityPolicy.VOLATILE,
)

# The task: reliable and transient-local, so a node started after the instruction still
# receives it, and only the latest instruction counts.
INSTRUCTION_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=1,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.TRANSIENT_LOCAL,
)

# The task from volatile publishers too (ros2 topic pub, rqt, rosbridge), which a
# transient-local subscription does not match.
INSTRUCTION_VOLATILE_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=1,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)

# Joint states: best effort, compatible with joint_state_broadcaster (reliable) and with
# best-effort drivers. The node reads them once per control tick (``PolledSubscription``), so
# the history holds what arrives between ticks: 100 messages cover a 1 kHz publisher at a
# 10 Hz control rate, and partial messages from several publishers are not pushed out.
JOINT_STATES_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=100,
    reliability=ReliabilityPolicy.BEST_EFFORT,
    durability=DurabilityPolicy.VOLATILE,
)

# Commands to ros2_control controllers, which subscribe reliable and volatile.
COMMAND_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=10,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)

# The goals sent to ros2_control actions and their answers (~/command_goals), for a recorder:
# reliable, with room for a burst of answers between two reads.
COMMAND_GOALS_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=100,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)

# Services whose every call must be answered (a burst of ~/reset_episode calls): the default
# service profile keeps only the last 10 requests and drops the rest unanswered.
SERVICE_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_ALL,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)

# The node's ~/episode events: none lost, and a late subscriber (a recorder, a success detector)
# still gets the last ones, the current episode among them.
EPISODE_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=10,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.TRANSIENT_LOCAL,
)

# ``~/tick_done`` (a lockstep simulator waits for each) and the simulator's ``/clock``: every
# tick counts, and a late joiner needs none of the old ones. rclpy's /clock reader is best
# effort, which a reliable writer serves.
TICK_DONE_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=10,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)
CLOCK_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=1,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)

# /diagnostics, as diagnostic_aggregator and rqt_robot_monitor expect it.
DIAGNOSTICS_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=10,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)

# Remote inference (robot <-> vla_policy_server): every request and chunk is wanted, and a
# late joiner must not receive old ones (a chunk answered before it started is stale). Every
# robot reads every answer of a batch, and the server reads every robot's request, so those
# readers (and the server's answer writer) keep MAX_ROBOTS messages: a batch of more answers
# than a reader keeps would overwrite some before they are taken. A robot's request writer
# keeps few: it has one request in flight, and each is about a megabyte of frames.
MAX_ROBOTS = 256
REMOTE_FLEET_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=MAX_ROBOTS,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)
REMOTE_REQUEST_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=4,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)
# Server heartbeats: only the newest matters, and a lost one is replaced by the next.
HEARTBEAT_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=1,
    reliability=ReliabilityPolicy.BEST_EFFORT,
    durability=DurabilityPolicy.VOLATILE,
)
