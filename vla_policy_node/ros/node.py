"""
The policy node: wiring of subscriptions, the control timer, the inference thread and safety.

Data flow::

    cameras, /joint_states, instruction --> ObservationBuffer (validated, time of arrival)
    control timer (control_rate_hz) --> ChunkScheduler.needs_chunk? --> InferenceWorker thread
    InferenceWorker --> ChunkScheduler.submit_chunk
    InferenceWorker fault (raised, non-finite, late) --> chunk dropped, plan dropped, hold
    control timer --> ChunkScheduler.next_action (+ peek: the plan) --> MotionLimits --> command

All ROS callbacks run on one single-threaded executor: each is a few microseconds of
bookkeeping under one lock (shared with the inference thread's result callback), so they
never queue behind each other. Inference runs in its own thread, so the timer, subscriptions,
service and diagnostics never wait for the policy. (rclpy's MultiThreadedExecutor was measured
to busy-spin at 100% CPU under camera traffic, starving inference of the GIL.)
Whenever an input is missing, stale or bad, or no action is queued, the node holds: it sends
one hold command (the last safe command) when it stops commanding, and nothing after that
until it can command again.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
import numpy as np
from rcl_interfaces.msg import SetParametersResult
import rclpy
from rclpy.duration import Duration
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from vla_policy_node.core.chunking import ChunkScheduler, SchedulerConfig
from vla_policy_node.core.safety import SafetyError
from vla_policy_node.ros import diagnostics
from vla_policy_node.ros.conversions import (
    action_to_float64_multiarray,
    chunk_to_joint_trajectory,
    ConversionError,
    image_to_rgb,
    instruction_text,
    merge_joint_state,
    stamp_seconds,
)
from vla_policy_node.ros.inputs import INSTRUCTION, JOINT_STATES, ObservationBuffer
from vla_policy_node.ros.params import (
    current_values,
    declare_parameters,
    NodeSettings,
    ParameterError,
    settings_from_values,
    validate_change,
)
from vla_policy_node.ros.policy_loader import make_policy, PolicyLoadError
from vla_policy_node.ros.qos import (
    CAMERA_QOS,
    COMMAND_QOS,
    DIAGNOSTICS_QOS,
    INSTRUCTION_QOS,
    JOINT_STATES_QOS,
)
from vla_policy_node.ros.worker import FAULTS, InferenceResult, InferenceWorker

NODE_NAME = 'vla_policy_node'
LOG_PERIOD_S = 2.0
NODE_COUNTERS = ('control_ticks', 'commands_published', 'holds_published', 'clamped_joints',
                 'clamped_lookahead_joints', 'episode_resets', 'rejected_chunks',
                 'rejected_inputs')


class VlaPolicyNode(Node):
    """Runs a VLA policy against live cameras, joint states and an instruction."""

    def __init__(self, **node_options: Any) -> None:
        super().__init__(NODE_NAME, **node_options)
        self._settings: NodeSettings = declare_parameters(self, _ros_arguments(node_options))
        self._lock = threading.Lock()
        self._policy = make_policy(
            self._settings, self.get_logger().info, self.get_logger().warning)
        self._scheduler = ChunkScheduler(self._scheduler_config(self._policy.chunk_size))
        self._inputs = ObservationBuffer(self._settings.camera_names, self._settings.joint_names)
        self._counters = dict.fromkeys(NODE_COUNTERS, 0)
        self._faults = diagnostics.FaultTally(FAULTS)
        self._policy_fault: str | None = None
        self._last_command: np.ndarray | None = None
        self._hold_reason: str | None = 'starting'
        self._stopped = False
        self._last_log: dict[str, float] = {}
        self._reported_unknown: set[str] = set()
        self._worker = InferenceWorker(self._policy, self._on_inference_result, self._now,
                                       self._settings.policy_deadline)
        self._wire()
        self._worker.start()
        self.get_logger().info(f'ready: {self._model_description()}')

    def _wire(self) -> None:
        """Create callbacks, publishers, timers and, last, the subscriptions (joy_teleop)."""
        settings = self._settings
        self.add_on_set_parameters_callback(self._on_set_parameters)
        if hasattr(self, 'add_post_set_parameters_callback'):
            self.add_post_set_parameters_callback(self._after_set_parameters)
        command_type = (JointTrajectory if settings.command_interface == 'joint_trajectory'
                        else Float64MultiArray)
        self._command_pub = self.create_publisher(
            command_type, settings.command_topic, COMMAND_QOS)
        self._diagnostics_pub = self.create_publisher(
            DiagnosticArray, '/diagnostics', DIAGNOSTICS_QOS)
        self.create_service(Trigger, '~/reset_episode', self._on_reset_episode)
        self._control_timer = self.create_timer(
            1.0 / settings.control_rate_hz, self._on_control_tick)
        # Set by the inference thread when a chunk ends a hold: the executor then commands at
        # once and re-phases the timer, instead of leaving the robot still until the next tick.
        self._chunk_ready = self.create_guard_condition(self._on_chunk_ready)
        self.create_timer(settings.diagnostics_period, self._on_diagnostics_tick)
        for topic, name in zip(settings.camera_topics, settings.camera_names):
            self.create_subscription(
                Image, topic, lambda msg, camera=name: self._on_image(camera, msg),
                CAMERA_QOS)
        self.create_subscription(JointState, settings.joint_states_topic,
                                 self._on_joint_state, JOINT_STATES_QOS)
        self.create_subscription(String, settings.instruction_topic, self._on_instruction,
                                 INSTRUCTION_QOS)

    def _scheduler_config(self, chunk_size: int) -> SchedulerConfig:
        chunking = self._settings.chunking
        return SchedulerConfig(
            control_rate_hz=self._settings.control_rate_hz,
            horizon=chunking.horizon or chunk_size,
            refill_threshold=chunking.refill_threshold, blend=chunking.blend,
            blend_weight=chunking.blend_weight, ensemble_decay=chunking.ensemble_decay,
            rtc_max_guidance_weight=chunking.rtc_max_guidance_weight)

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    # ------------------------------------------------------------------ inputs
    def _on_image(self, camera: str, msg: Image) -> None:
        try:
            rgb = image_to_rgb(msg)
        except ConversionError as error:
            self._reject(camera, error)
            return
        with self._lock:
            stamp = stamp_seconds(msg.header.stamp) if self._settings.use_header_stamps else None
            now = self._now()
            problem = self._inputs.set_image(
                camera, rgb, now, stamp, self._settings.max_observation_age)
            if problem is not None:
                self._mark_rejected(camera, problem)
            elif not self._stopped and self._inputs.problem(
                    now, self._settings.max_observation_age) is None:
                self._request_chunk(now)        # start on the fresh frame, not at the next tick
        if problem is not None:
            self._log_limited(camera, f'rejected {camera} input: {problem}; holding')

    def _on_joint_state(self, msg: JointState) -> None:
        with self._lock:
            try:
                update = merge_joint_state(msg.name, msg.position, self._settings.joint_names,
                                           self._inputs.positions)
            except ConversionError as error:
                self._reject(JOINT_STATES, error, locked=True)
                return
            self._inputs.set_positions(update.positions, update.updated, self._now())
        self._report_unknown_joints(update.unknown_joints)

    def _on_instruction(self, msg: String) -> None:
        try:
            text = instruction_text(msg.data, self._settings.max_instruction_length)
        except ConversionError as error:
            self._reject(INSTRUCTION, error)
            return
        with self._lock:
            new = text != self._inputs.instruction
            changed = self._inputs.set_instruction(text)
        if new:
            self.get_logger().info(f'instruction: {text[:200]!r}')
        if changed and self._settings.reset_on_instruction_change:
            self._reset_episode('instruction changed')

    def _reject(self, stream: str, error: ConversionError, locked: bool = False) -> None:
        """Mark a stream faulted (no command until it recovers) and log, rate-limited."""
        if locked:
            self._mark_rejected(stream, str(error))
        else:
            with self._lock:
                self._mark_rejected(stream, str(error))
        self._log_limited(stream, f'rejected {stream} input: {error}; holding')

    def _mark_rejected(self, stream: str, reason: str) -> None:
        self._inputs.reject(stream, reason)
        self._counters['rejected_inputs'] += 1

    def _report_unknown_joints(self, names: tuple[str, ...]) -> None:
        new = sorted(set(names) - self._reported_unknown)
        if new:
            self._reported_unknown.update(new)
            self.get_logger().info(f'ignoring joints not in joint_names: {new}')

    # ------------------------------------------------------------------ control
    def _on_control_tick(self) -> None:
        now = self._now()
        with self._lock:
            if self._stopped:
                return
            self._counters['control_ticks'] += 1
            problem = self._inputs.problem(now, self._settings.max_observation_age)
            if problem is not None:
                self._discard_plan()
                self._hold(problem)
                return
            # Execute this tick's step first: a request made now is for the next step, so the
            # delay compensation counts exactly the steps executed while the chunk is computed.
            action = self._scheduler.next_action(now)
            if action is None:
                self._hold(self._policy_fault or 'waiting for actions from the policy')
            else:
                self._command(np.vstack([action, self._lookahead()]))
            self._request_chunk(now)

    def _request_chunk(self, now: float) -> None:
        if self._scheduler.needs_chunk() and not self._worker.busy:
            request = self._scheduler.begin_request(now)
            self._worker.submit(request, self._inputs.observation())

    def _discard_plan(self) -> None:
        """Drop actions planned from observations taken before an input went bad."""
        if self._scheduler.actions_left > 0 or self._scheduler.in_flight:
            self._scheduler.drop_plan()

    def _lookahead(self) -> np.ndarray:
        """Return the planned actions after this tick's, sent with it as trajectory points."""
        points = self._settings.trajectory_points
        if self._settings.command_interface != 'joint_trajectory' or points == 1:
            return np.zeros((0, len(self._settings.joint_names)))
        return self._scheduler.peek(points - 1 if points else 0)

    def _command(self, plan: np.ndarray) -> None:
        """Send plan[0] now (and the rest as later trajectory points), all of it clamped."""
        previous = self._last_command
        if previous is None:
            previous = self._inputs.positions
        try:
            safe, clamped = self._settings.limits.clamp_sequence(
                plan, previous, 1.0 / self._settings.control_rate_hz)
        except SafetyError as error:
            self._discard_plan()
            self._hold(f'unsafe action: {error}')
            return
        self._counters['clamped_joints'] += int(clamped[0])
        self._counters['clamped_lookahead_joints'] += int(clamped[1:].sum())
        self._last_command = safe[0]
        self._publish_positions(safe)
        self._counters['commands_published'] += 1
        if self._hold_reason is not None:
            self.get_logger().info(f'commanding (was holding: {self._hold_reason})')
        self._hold_reason = None

    def _hold(self, reason: str) -> None:
        """Stop commanding; on the transition, send one hold command and log why."""
        if self._hold_reason is None:
            published = self._publish_hold()
            self.get_logger().warning(
                f'holding: {reason}' + ('' if published else ' (no joint position known yet)'))
        elif reason != self._hold_reason:
            self._log_limited('hold', f'holding: {reason}')
        self._hold_reason = reason

    def _publish_hold(self) -> bool:
        """Publish the last safe command (or the measured position); False if neither exists."""
        target = self._last_command
        if target is None:
            positions = self._inputs.positions
            target = positions if np.all(np.isfinite(positions)) else None
        if target is None:
            return False
        self._publish_positions(target[None, :])
        self._counters['holds_published'] += 1
        return True

    def _publish_positions(self, points: np.ndarray) -> None:
        """Publish points (T, J): all as a trajectory, or only the first as a forward command."""
        if self._settings.command_interface == 'joint_trajectory':
            self._command_pub.publish(chunk_to_joint_trajectory(
                points, self._settings.joint_names, 1.0 / self._settings.control_rate_hz))
        else:
            self._command_pub.publish(action_to_float64_multiarray(points[0]))

    def _on_inference_result(self, result: InferenceResult) -> None:
        """Take a result of the inference thread; the scheduler decides whether it is used."""
        error = None
        with self._lock:
            if self._stopped:
                return
            if result.fault is not None:
                error = f'policy {result.fault}: {result.error}'
                self._faults.add(result.fault, error, self._now())
                self._scheduler.cancel_request(result.request)
                self._policy_fault = error
                self._discard_plan()
                self._hold(error)
            else:
                error = self._submit(result)
        if error is not None:
            self._log_limited(f'policy {result.fault or "rejected"}', f'discarded policy output: {error}')

    def _submit(self, result: InferenceResult) -> str | None:
        try:
            if self._scheduler.submit_chunk(result.request, result.chunk, result.finished_at):
                self._policy_fault = None
                if self._hold_reason is not None:
                    self._chunk_ready.trigger()
        except ValueError as rejected:
            self._counters['rejected_chunks'] += 1
            return str(rejected)
        return None

    def _on_chunk_ready(self) -> None:
        self._control_timer.reset()
        self._on_control_tick()

    # ------------------------------------------------------------------ episodes
    def _on_reset_episode(self, request: Trigger.Request,
                          response: Trigger.Response) -> Trigger.Response:
        self._reset_episode('reset_episode service')
        response.success = True
        response.message = 'episode reset: prefix cache, action queue and blending cleared'
        return response

    def _reset_episode(self, reason: str) -> None:
        with self._lock:
            self._scheduler.reset()
            self._worker.request_reset()
            self._last_command = None       # the next episode starts from the measured joints
            self._counters['episode_resets'] += 1
            count = self._counters['episode_resets']
        self.get_logger().info(f'episode reset #{count} ({reason})')

    # ------------------------------------------------------------------ parameters
    def _on_set_parameters(self, parameters: list[Parameter]) -> SetParametersResult:
        """Validate only; state changes in the post-set callback (Humble has none: here)."""
        reason = validate_change(current_values(self), parameters)
        if reason is None and not hasattr(self, 'add_post_set_parameters_callback'):
            self._apply_settings(parameters)
        return SetParametersResult(successful=reason is None, reason=reason or '')

    def _after_set_parameters(self, parameters: list[Parameter]) -> None:
        self._apply_settings([])

    def _apply_settings(self, pending: list[Parameter]) -> None:
        values = current_values(self)
        values.update({p.name: p.value for p in pending if p.name in values})
        settings = settings_from_values(values)
        with self._lock:
            self._settings = settings
        self._worker.deadline = settings.policy_deadline

    # ------------------------------------------------------------------ reporting
    def _on_diagnostics_tick(self) -> None:
        self._diagnostics_pub.publish(diagnostics.status_to_diagnostics(
            self.status(), self.get_name(), self.get_clock().now().to_msg()))

    def status(self) -> diagnostics.NodeStatus:
        """Take a consistent snapshot of counters, latencies, state and input health."""
        policy = self._worker.stats
        with self._lock:
            now = self._now()
            inputs = self._inputs.health(now, self._settings.max_observation_age)
            faults = self._faults.report(now, self._settings.diagnostics_period)
            counters = {**policy['counters'], **self._counters, **{
                f'policy_{kind}': count for kind, count in self._faults.totals.items()}, **{
                ('scheduler_resets' if key == 'resets' else key): value
                for key, value in self._scheduler.stats.items()}}
            hold = self._hold_reason
        level = max([diagnostics.OK, faults.level] + [health.level for health in inputs])
        if hold is not None:
            level = max(level, diagnostics.WARN)
        return diagnostics.NodeStatus(
            state='commanding' if hold is None else f'holding: {hold}', level=level,
            model=self._model_description(), device=str(self._policy.device),
            counters=counters, latencies=policy['latencies'], inputs=inputs,
            policy_faults=faults)

    def _model_description(self) -> str:
        if self._settings.checkpoint:
            return f'{self._policy.family} from {self._settings.checkpoint}'
        return f'{self._policy.family} model with RANDOM weights (no checkpoint)'

    def _log_limited(self, key: str, text: str) -> None:
        """Warn at most once per LOG_PERIOD_S per key, so a bad stream cannot flood the log."""
        now = time.monotonic()
        if now - self._last_log.get(key, -LOG_PERIOD_S) >= LOG_PERIOD_S:
            self._last_log[key] = now
            self.get_logger().warning(text)

    # ------------------------------------------------------------------ shutdown
    @property
    def inference_alive(self) -> bool:
        """Tell whether the inference thread still runs; without it the node must not stay up."""
        return self._worker.alive

    def stop(self) -> bool:
        """
        Stop commanding, publish a hold, then stop the inference thread.

        The hold goes out first and is waited for (briefly) until subscribers have it; a
        policy step still running afterwards can no longer reach the robot. Returns whether
        the inference thread has finished.
        """
        self._control_timer.cancel()
        with self._lock:
            self._stopped = True
            held = self._publish_hold()
        if held:
            self._command_pub.wait_for_all_acked(Duration(seconds=1.0))
        finished = self._worker.stop(timeout=2.0)
        status = self.status()
        total = status.latencies.get('total', (float('nan'),) * 2)
        self.get_logger().info(
            'stopped{}: control_steps={control_steps} prefix_passes={prefix_passes} '
            'commands_published={commands_published} holds_published={holds_published} '
            'total latency p50={p50:.1f} ms p95={p95:.1f} ms'.format(
                ' after publishing a hold' if held else '', p50=total[0] * 1e3,
                p95=total[1] * 1e3, **status.counters))
        return finished


def _ros_arguments(node_options: dict[str, Any]) -> list[str]:
    """Return the arguments rcl reads this node's parameters from (process's, then own)."""
    arguments = list(sys.argv) if node_options.get('use_global_arguments', True) else []
    return arguments + list(node_options.get('cli_args') or [])


def main(args: list[str] | None = None) -> int:
    """
    Run the node until SIGINT/SIGTERM; exit 0 after a hold, 1 on a configuration error.

    A callback that raises ends the executor thread, and a bug could end the inference thread;
    either way the node then holds and exits 1 rather than stay up without a control loop.

    rclpy's own signal handling would shut the context down before the hold could be sent,
    so the node installs its own handlers and shuts down in order itself.
    """
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        node = VlaPolicyNode()
    except (ParameterError, PolicyLoadError) as error:
        rclpy.logging.get_logger(NODE_NAME).fatal(f'cannot start: {error}')
        rclpy.try_shutdown()
        return 1
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, name='executor', daemon=True)
    spinner.start()
    while not stop.wait(0.1) and spinner.is_alive() and node.inference_alive:
        pass
    code = 0 if stop.is_set() else 1
    finished = node.stop()
    executor.shutdown(timeout_sec=1.0)
    spinner.join(1.0)
    node.destroy_node()
    rclpy.try_shutdown()
    if not finished:
        # A policy step still inside torch would abort the interpreter's finalisation;
        # everything that matters (the hold, the shutdown of rclpy) is done.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
