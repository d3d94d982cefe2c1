# SPDX-License-Identifier: Apache-2.0
"""
The policy node: ROS wiring around the ROS-free control loop (``control/loop.py``).

Subscriptions convert messages and hand them to the loop; the control timer ticks it; the
loop's one exit for commands, its sink, is the only code that publishes to the command topic.
Every safety decision (input health, stamps, staleness, holds, limits, the step limit) is the
loop's. The node adds what only ROS knows: who else is on the command topic, a wall-clock
watchdog that keeps holding and reporting when a simulated clock stops, and /diagnostics.

Input rates do not set the node's work: joint states and camera frames are read once per tick from
subscriptions of the node that no executor waits on (``PolledSubscription``); only each camera's newest
frame is decoded, at the tick or when a chunk arrives (which starts the next request at once). Inference
runs on its own thread; all callbacks run on one executor thread and take microseconds.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
import numpy as np
from rcl_interfaces.msg import SetParametersResult
from rclpy.clock import Clock, ClockType
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String
from std_srvs.srv import Trigger

from vla_policy_node.control.ages import ages_loosened, StartAges
from vla_policy_node.control.chunking import SchedulerConfig
from vla_policy_node.control.health import WARN
from vla_policy_node.control.loop import ControlLoop, INSTRUCTION, JOINT_STATES, LoopSettings, LoopStatus
from vla_policy_node.control.inference import InferenceWorker
from vla_policy_node.control.joint_map import joint_mapped
from vla_policy_node.control.observations import unknown_joints_line
from vla_policy_node.control.real_time import real_time_verdict
from vla_policy_node.ros import diagnostics
from vla_policy_node.ros.command_groups import CommandOutputs, TRAJECTORY_INTERFACES
from vla_policy_node.ros.compressed import camera_topic, compressed_to_rgb
from vla_policy_node.ros.conversions import (ConversionError, image_to_rgb, instruction_from_cdr, stamp_seconds,
                                             undecodable_is_an_error)
from vla_policy_node.ros.episodes import Episodes
from vla_policy_node.ros.params import current_values, declare_parameters, NodeSettings, validate_change
from vla_policy_node.ros.policy_loader import make_policy
from vla_policy_node.ros.polled_input import PolledSubscription
from vla_policy_node.ros.process import run_until_signal, StopRequested  # noqa: F401 (re-exported)
from vla_policy_node.ros.server.client import RemoteInference
from vla_policy_node.ros.task_action import TaskAction
from vla_policy_node.ros.tick_answers import TickAnswers
from vla_policy_node.ros.qos import (CAMERA_READER_QOS, COMMAND_QOS, DIAGNOSTICS_QOS, INSTRUCTION_QOS,
                                     INSTRUCTION_VOLATILE_QOS, JOINT_STATES_QOS, SERVICE_QOS)

NODE_NAME = 'vla_policy_node'
WATCHDOG_PERIOD_S = 0.1


def loop_settings(settings: NodeSettings) -> LoopSettings:
    """Map the node's parameters to what the control loop obeys."""
    trajectory = any(group.interface in TRAJECTORY_INTERFACES for group in settings.command_groups)
    points = settings.trajectory_points if trajectory else 1
    first_point = tuple(sorted(i for group in settings.command_groups if group.interface not in TRAJECTORY_INTERFACES
                               for i in group.indices))
    return LoopSettings(
        joint_names=settings.joint_names, camera_names=settings.camera_names,
        control_rate_hz=settings.control_rate_hz, limits=settings.limits,
        max_observation_age=settings.max_observation_age,
        max_action_age=settings.max_action_age, use_header_stamps=settings.use_header_stamps,
        reset_on_instruction_change=settings.reset_on_instruction_change, plan_points=points,
        first_point_joints=first_point)


def remote_deadline(settings: NodeSettings, sim_time: bool) -> float:
    """
    Return the seconds to wait for a server's answer: past ``max_observation_age`` it would be refused as stale.

    The wait runs on the wall clock; with ``use_sim_time`` ages are on the simulator's clock,
    which may run slower, so there only ``policy_deadline`` bounds it.
    """
    return settings.policy_deadline if sim_time else min(settings.policy_deadline, settings.max_observation_age)


def scheduler_config(settings: NodeSettings, chunk_size: int) -> SchedulerConfig:
    """Chunk execution settings (horizon 0 means the policy's whole chunk)."""
    return dataclasses.replace(settings.scheduler, horizon=settings.horizon or chunk_size)


def node_status(settings: NodeSettings, policy: Any, worker_stats: dict[str, Any], loop: LoopStatus,
                output_counters: dict[str, int], horizon: int, lockstep: bool) -> diagnostics.NodeStatus:
    """
    Build the node's status from its parts: the policy (None: a server's), its worker's stats, the loop's.

    ``horizon``: the actions executed per chunk; ``lockstep``: on a simulator's clock that waits for chunks.
    """
    device = 'remote' if policy is None else str(policy.device)
    latency_p95 = worker_stats['latencies'].get('total', (math.nan, math.nan))[1]
    return diagnostics.NodeStatus(
        state=loop.state, level=loop.level, model=model_description(settings, policy, worker_stats.get('server')),
        device=device, counters={**worker_stats['counters'], **loop.counters, **output_counters},
        latencies=worker_stats['latencies'], inputs=loop.inputs, policy_faults=loop.policy_faults,
        max_action_age=loop.max_action_age, last_chunk_latency=loop.last_chunk_latency,
        real_time=real_time_verdict(latency_p95, scheduler_config(settings, horizon), lockstep, loop.refill_at))


def model_description(settings: NodeSettings, policy: Any, server: str | None = None) -> str:
    """Say which policy runs: a server's, a checkpoint's, or random weights."""
    if policy is None:
        return f"policy of the server {server or ' or '.join(settings.remote_servers)}"
    if settings.checkpoint:
        return f'{policy.family} from {settings.checkpoint}'
    return f'{policy.family} model with RANDOM weights (no checkpoint)'


def uses_sim_time(node: Node) -> bool:
    """Tell whether the node runs on /clock (a simulator in lockstep)."""
    return bool(node.get_parameter('use_sim_time').value)


def stopped_line(status: diagnostics.NodeStatus, held: bool) -> str:
    """Return the node's last log line: what it did, and its total latency."""
    total = status.latencies.get('total', (float('nan'),) * 2)
    return ('stopped{}: control_steps={control_steps} prefix_passes={prefix_passes} '
            'commands_published={commands_published} holds_published={holds_published} '
            'total latency p50={p50:.1f} ms p95={p95:.1f} ms').format(
        ' after publishing a hold' if held else '', p50=total[0] * 1e3, p95=total[1] * 1e3, **status.counters)


class PolicyWiring:
    """
    The node's wiring, shared by the plain node and the lifecycle node (ros/lifecycle_node.py).

    Mixed into an rclpy ``Node``: :meth:`_declare` reads the parameters, :meth:`_load` builds
    the policy and its inference thread, :meth:`_wire` the loop and every ROS entity.
    """

    # Latched publishers (a late node still gets the task) and volatile ones (ros2 topic pub,
    # rqt, rosbridge): a latched message reaches both subscriptions, the same text twice.
    INSTRUCTION_PROFILES = (INSTRUCTION_QOS, INSTRUCTION_VOLATILE_QOS)

    def _declare(self, node_options: dict[str, Any]) -> None:
        self._loop: ControlLoop | None = None           # None until wired (lifecycle: configured)
        self._worker: InferenceWorker | None = None
        self._joint_states: PolledSubscription | None = None
        self._cameras: tuple[tuple[str, PolledSubscription], ...] = ()    # (camera name, its frames)
        self._task: TaskAction | None = None             # None while the parameters are refused
        self._tick_answers: TickAnswers | None = None    # with use_sim_time: ~/tick_done
        self._settings: NodeSettings = declare_parameters(self, _ros_arguments(node_options))
        # Limits and the age limits only tighten from here on; loosening them takes a restart.
        self._envelope = loop_settings(self._settings).limits
        self._start_ages = StartAges(self._settings.max_observation_age, self._settings.max_action_age,
                                     self._settings.use_header_stamps)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        if hasattr(self, 'add_post_set_parameters_callback'):
            self.add_post_set_parameters_callback(self._after_set_parameters)
        self._episodes = Episodes(self)
        self._task = TaskAction(self, self._settings.task_success_topic, self._settings.max_instruction_length,
                                lambda: self._loop, self._task_refusal, self._now, self._episodes)

    def _task_refusal(self) -> str | None:
        """Say why a RunInstruction goal cannot start now, or None."""
        return None if self._loop is not None else 'the node has no control loop yet'

    def _load(self) -> None:
        """Load the policy and its inference thread, or the server's client; it starts once a loop is bound."""
        self._policy, self._worker = self._make_inference()
        # camera -> (width, height) of its first good frame: a frame declaring another size is refused
        # before it is decoded (a decode bomb), until the node restarts (a lifecycle node: re-activates)
        self._frame_sizes: dict[str, tuple[int, int]] = {}
        cameras = zip(self._settings.camera_names, self._settings.camera_transports)
        self._compressed = {name for name, transport in cameras if transport == 'compressed'}
        self._reported_unknown: set[str] = set()
        self._other_publishers: tuple[int, ...] = ()

    def _make_loop(self) -> ControlLoop:
        """Make a control loop bound to the inference (units mapped); its sink is :meth:`_publish`."""
        settings = self._settings
        horizon = settings.horizon if self._policy is None else self._policy.chunk_size
        inference = joint_mapped(self._worker, settings.joint_map)
        loop = ControlLoop(loop_settings(settings), scheduler_config(settings, horizon), inference, self._publish,
                           self._log, on_chunk_ready=self._chunk_ready.trigger, envelope=self._envelope)
        if self._tick_answers is not None:
            self._tick_answers.follow(loop, inference)
        return loop

    def _make_inference(self) -> tuple[Any, InferenceWorker | RemoteInference]:
        """Return (the policy, its inference thread), or (None, the remote server's client)."""
        settings = self._settings
        if settings.inference == 'remote':
            return None, RemoteInference(self, settings.remote_servers, settings.joint_names, self._now,
                                         remote_deadline(settings, uses_sim_time(self)), self.get_logger().warning,
                                         settings.remote_server_timeout, self.get_logger().info, settings.horizon,
                                         settings.remote_fleet_key)
        policy = make_policy(settings, self.get_logger().info, self.get_logger().warning, (), settings.horizon,
                             settings.guided)
        return policy, InferenceWorker(policy, None, self._now, settings.policy_deadline)

    def _wire(self) -> None:
        """Create publishers, the loop, services, timers and, last, the subscriptions (joy_teleop)."""
        settings = self._settings
        self._outputs = CommandOutputs(self, settings.command_groups, COMMAND_QOS,
                                       settings.trajectory_velocities,
                                       gripper_max_effort=settings.gripper_max_effort, now=self._now)
        self._diagnostics_pub = self.create_publisher(DiagnosticArray, '/diagnostics', DIAGNOSTICS_QOS)
        # Set by the inference thread when a chunk ends a hold: the executor then commands at
        # once and re-phases the timer, instead of leaving the robot still until the next tick.
        self._chunk_ready = self.create_guard_condition(self._on_chunk_ready)
        if uses_sim_time(self):
            self._tick_answers = TickAnswers(self, lambda: self._worker.busy)
        self._loop = self._make_loop()
        self._check_command_topic()
        self.create_service(Trigger, '~/reset_episode', self._on_reset_episode, qos_profile=SERVICE_QOS)
        self.create_service(Trigger, '~/restart_from_measured', self._on_restart_from_measured,
                            qos_profile=SERVICE_QOS)
        self._control_timer = self.create_timer(1.0 / settings.control_rate_hz, self._on_control_tick)
        wall = Clock(clock_type=ClockType.STEADY_TIME)      # runs when a simulated clock stops
        self.create_timer(WATCHDOG_PERIOD_S, self._on_watchdog, clock=wall)
        self.create_timer(settings.diagnostics_period, self._on_diagnostics_tick, clock=wall)
        self._cameras = tuple(
            (name, PolledSubscription(self, CompressedImage if transport == 'compressed' else Image,
                                      camera_topic(topic, transport), CAMERA_READER_QOS))
            for topic, name, transport in zip(settings.camera_topics, settings.camera_names,
                                              settings.camera_transports))
        self._joint_states = PolledSubscription(self, JointState, settings.joint_states_topic, JOINT_STATES_QOS)
        for qos in self.INSTRUCTION_PROFILES:
            # A volatile publisher (``ros2 topic pub``) cannot match the transient-local reader;
            # its volatile twin takes the instruction, so that mismatch is expected, not logged.
            quiet = SubscriptionEventCallbacks(incompatible_qos=lambda info: None)
            self.create_subscription(String, settings.instruction_topic, self._on_instruction, qos, raw=True,
                                     event_callbacks=quiet if qos.durability == DurabilityPolicy.TRANSIENT_LOCAL
                                     else None)

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _log(self, severity: str, text: str) -> None:
        # One call site per severity: rclpy refuses a call site whose severity changes.
        if severity == 'info':
            self.get_logger().info(text)
        else:
            self.get_logger().warning(text)

    # ------------------------------------------------------------------ inputs
    def _take_frames(self) -> None:
        """Decode each camera's newest frame received since the last look; the older ones are never decoded."""
        now = self._now()
        for camera, frames in self._cameras:
            for raw, age in frames.take_all()[-1:]:        # the newest frame, if one came
                compressed = camera in self._compressed
                try:
                    msg = undecodable_is_an_error(frames.decode, raw)
                    size = self._frame_sizes.get(camera)
                    rgb = compressed_to_rgb(msg, expected=size) if compressed else image_to_rgb(msg, expected=size)
                except ConversionError as error:
                    self._loop.reject(camera, str(error))
                    continue
                self._frame_sizes.setdefault(camera, (rgb.shape[1], rgb.shape[0]))
                self._loop.on_image(camera, rgb, now - age, stamp_seconds(msg.header.stamp))

    def _take_joint_states(self) -> None:
        """Decode the newest messages until every joint is covered; hand them over oldest first."""
        now = self._now()
        taken, covered, joints = [], set(), set(self._settings.joint_names)
        undecodable = None
        for raw, age in reversed(self._joint_states.take_all()):
            if joints <= covered:
                break
            try:
                msg = undecodable_is_an_error(self._joint_states.decode, raw)
            except ConversionError as error:
                undecodable = error         # older messages than this one are not used
                break
            taken.append((msg, now - age))
            if len(msg.position):           # other devices' messages cover none of ours
                covered.update(name for name in msg.name if name in joints)
        if undecodable is not None:         # in time order: the bad message, then the newer ones
            self._loop.reject(JOINT_STATES, str(undecodable))
        for msg, arrival in reversed(taken):
            unknown = self._loop.on_joint_state(
                msg.name, msg.position, arrival, stamp_seconds(msg.header.stamp))
            line = unknown_joints_line(unknown, self._reported_unknown)
            if line is not None:
                self.get_logger().info(line)

    def _on_instruction(self, raw: bytes) -> None:
        try:
            text = instruction_from_cdr(raw, self._settings.max_instruction_length)
        except ConversionError as error:
            self._loop.reject(INSTRUCTION, str(error))
            return
        self._episodes.on_instruction(text, self._loop.on_instruction(text))

    # ------------------------------------------------------------------ control
    def _on_control_tick(self) -> None:
        self._take_joint_states()
        self._take_frames()
        self._loop.set_command_link(*self._outputs.link(self._other_publishers))
        self._loop.tick(self._now())
        self._task.on_tick()
        if self._tick_answers is not None:
            self._tick_answers.ticked()

    def _on_chunk_ready(self) -> None:
        # Commanding (or a due tick ran first and resumed: no second tick): request now, not a tick later;
        # in lockstep a chunk costs no simulated time, and the tick that asked for it waits for it alone.
        if self._loop.hold_reason is None:
            self._take_joint_states()
            self._take_frames()
            if self._tick_answers is None:
                self._loop.refill(self._now())
            return
        self._control_timer.reset()
        self._on_control_tick()

    def _check_command_topic(self) -> None:
        self._other_publishers = self._outputs.other_publishers()

    def _on_watchdog(self) -> None:
        self._check_command_topic()
        self._loop.watchdog(self._now())

    def _publish(self, points: np.ndarray, obs_times: np.ndarray | None, joints: np.ndarray | None) -> None:
        """Publish for the loop (its sink): safe points (T, J), split over the command groups (``joints``' only)."""
        self._outputs.publish(points, 1.0 / self._settings.control_rate_hz, joints)

    # ------------------------------------------------------------------ episodes
    def _on_reset_episode(self, request: Trigger.Request,
                          response: Trigger.Response) -> Trigger.Response:
        self._loop.reset_episode('reset_episode service')
        episode = self._episodes.start(None, 'reset_episode service')
        response.success = True
        response.message = f'episode {episode} started: prefix cache, action queue and blending cleared'
        return response

    def _on_restart_from_measured(self, request: Trigger.Request,
                                  response: Trigger.Response) -> Trigger.Response:
        refused = self._loop.restart_from_measured(self._now())
        response.success = refused is None
        response.message = refused or ('the next command steps from the measured joint state (the joints with '
                                       'a tracking error checked and those moved off their way)')
        return response

    # ------------------------------------------------------------------ parameters
    def _on_set_parameters(self, parameters: list[Parameter]) -> SetParametersResult:
        """Validate only (the loop too: limits only tighten); state changes in the post-set callback."""
        settings, reason = validate_change(current_values(self), parameters)
        if reason is None:      # also with no loop yet (lifecycle: unconfigured), or configure widens them
            looser = loop_settings(settings).limits.loosened_from(self._envelope)
            reason = None if looser is None else f'limits: {looser}'
        if reason is None:
            horizon = self._loop.horizon if self._loop is not None else settings.horizon or None
            horizon_s = None if horizon is None else horizon / settings.control_rate_hz
            reason = ages_loosened(settings, self._start_ages, horizon_s)
        if reason is None and self._loop is not None:
            reason = self._loop.check_update(loop_settings(settings))
        if reason is None and not hasattr(self, 'add_post_set_parameters_callback'):
            self._apply_settings(settings)          # Humble: no post-set callback
        return SetParametersResult(successful=reason is None, reason=reason or '')

    def _after_set_parameters(self, parameters: list[Parameter]) -> None:
        settings, reason = validate_change(current_values(self), [])
        if settings is not None:
            self._apply_settings(settings)

    def _apply_settings(self, settings: NodeSettings) -> None:
        try:
            if self._loop is not None:
                self._loop.update(loop_settings(settings))
        except ValueError as error:     # only if the robot moved between the two callbacks
            self.get_logger().error(f'parameter change not applied to the control loop: {error}')
            return
        self._settings = settings
        if isinstance(self._worker, RemoteInference):
            self._worker.deadline = remote_deadline(settings, uses_sim_time(self))
        elif self._worker is not None:
            self._worker.deadline = settings.policy_deadline

    # ------------------------------------------------------------------ reporting
    def _on_diagnostics_tick(self) -> None:
        status = self.status()
        self._diagnostics_pub.publish(diagnostics.status_to_diagnostics(
            status, diagnostics.status_prefix(self.get_fully_qualified_name()), self.get_clock().now().to_msg()))
        if status.real_time is not None and status.real_time.level >= WARN:      # in the log once a minute
            self.get_logger().warning(status.real_time.message, throttle_duration_sec=60.0)

    def status(self) -> diagnostics.NodeStatus:
        """Take a consistent snapshot of the loop's and the policy's counters and health."""
        return node_status(self._settings, self._policy, self._worker.stats,
                           self._loop.status(self._now(), self._settings.diagnostics_period), self._outputs.counters,
                           self._loop.horizon, lockstep=self._tick_answers is not None)

    # ------------------------------------------------------------------ shutdown
    @property
    def inference_alive(self) -> bool:
        """Tell whether the inference thread still runs; without it the node must not stay up."""
        return self._worker.alive

    def destroy_node(self) -> None:
        """
        Destroy the action server and the polled subscriptions first: they keep the node's handle.

        Also called by rclpy's shutdown on a node whose parameters were refused, built only in part.
        """
        if self._task is not None:
            self._task.destroy()
        for subscription in self._polled():
            subscription.destroy()
        super().destroy_node()

    def _polled(self) -> list[PolledSubscription]:
        """Return the subscriptions the control tick reads (joint states, cameras): no executor waits on them."""
        return [frames for _, frames in self._cameras] + ([] if self._joint_states is None else [self._joint_states])

    def stop(self) -> bool:
        """
        Publish a last hold (waited for, briefly, until subscribers have it), then stop inference.

        A policy step still running afterwards can no longer reach the robot. Returns whether
        the inference thread has finished.
        """
        self._control_timer.cancel()
        self._task.abort('the node stopped: holding')
        held = self._loop.stop(self._now())
        if held:
            self._outputs.wait_for_all_acked(1.0)
        finished = self._worker.stop(timeout=2.0)
        self.get_logger().info(stopped_line(self.status(), held))
        return finished


class VlaPolicyNode(PolicyWiring, Node):
    """Runs a VLA policy against live cameras, joint states and an instruction."""

    def __init__(self, **node_options: Any) -> None:
        Node.__init__(self, NODE_NAME, **node_options)
        self._declare(node_options)
        self._load()
        self._wire()
        self._worker.start()
        self.get_logger().info(f'ready: {model_description(self._settings, self._policy)}')


def _ros_arguments(node_options: dict[str, Any]) -> list[str]:
    """Return the arguments rcl reads this node's parameters from (process's, then own)."""
    arguments = list(sys.argv) if node_options.get('use_global_arguments', True) else []
    return arguments + list(node_options.get('cli_args') or [])


def main(args: list[str] | None = None, node_class: type = VlaPolicyNode) -> int:
    """
    Run the node until SIGINT/SIGTERM; exit 0 after a hold, 1 on a configuration error.

    A callback that raises ends the executor thread, and a bug could end the inference thread;
    either way the node then holds and exits 1 rather than stay up without a control loop.
    The signal/spin/shutdown sequence is ``ros.process.run_until_signal``.
    """
    return run_until_signal(node_class, lambda node: node.inference_alive, NODE_NAME, args)
