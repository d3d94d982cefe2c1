# SPDX-License-Identifier: Apache-2.0
"""
The simulated table-top robot over ROS 2: what `make demo` and the evaluation drive the node with.

It wraps a simulated robot of ``sim.robots`` (``robot``: the SO-101 in MuJoCo, or the planar
numpy arm of the fast tests) like a robot driver plus ros2_control: it publishes the camera
(``sensor_msgs/Image``, rgb8) and ``/joint_states`` (radians) with stamps, follows the
node's ``JointTrajectory`` points in time as joint_trajectory_controller does (each for the
joints it names), and a forward position command (``std_msgs/Float64MultiArray``) for the
joints of ``forward_joints`` as forward_command_controller does; and it runs episodes:
for each it places new blocks (the arm stays where it is), publishes the instruction
(reliable, transient local), calls the node's ``~/reset_episode`` and counts control
ticks until the tip touches the named block or ``max_steps`` pass. It prints one line
per episode and the success rate, and saves the first episode as a GIF and a PNG strip
captioned with the instruction, the outcome and the time.
While the tip touches the named block it publishes ``task_success``
(``vla_policy_interfaces/TaskSuccess``, the success signal of a RunInstruction goal) naming the
episode it saw start last on the node's ``~/episode`` topic (``policy_node``), as a success
detector would; with ``goal_driven`` it sets out one layout, prints its task and publishes no
instruction: a RunInstruction goal gives it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
import re
import time

from diagnostic_msgs.msg import DiagnosticArray
import numpy as np
import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory
from vla_policy_interfaces.msg import Episode, TaskSuccess

from vla_policy_node.ros.conversions import rgb_to_image
from vla_policy_node.ros.diagnostics import diagnostics_to_dict, status_prefix
from vla_policy_node.ros.qos import (CAMERA_QOS, COMMAND_QOS, DIAGNOSTICS_QOS, EPISODE_QOS, INSTRUCTION_QOS,
                                     JOINT_STATES_QOS)
from vla_policy_node.sim.recording import save_gif, save_strip
from vla_policy_node.sim.robots import make_env, ROBOTS
from vla_policy_node.sim.trajectory import TrajectoryFollower

SUCCESS_RATE = re.compile(r'^success rate: (?P<wins>\d+)/(?P<done>\d+) = ', re.MULTILINE)


@dataclass(frozen=True)
class EpisodeReport:
    """One episode as the robot saw it."""

    instruction: str            # the scene's task (what success is checked against)
    sent: str                   # what was published (differs for the instruction-blind baseline)
    success: bool
    steps: int                  # control ticks until the touch or the limit
    first_command_ms: float     # from the reset call to the first command after it
    policy_p50_ms: float        # the node's inference latency (p50, last /diagnostics)


class SimRobot(Node):
    """The simulated arm, its camera and the episode loop."""

    def __init__(self, **node_options) -> None:
        super().__init__('vla_policy_sim_robot', **node_options)
        declare = self.declare_parameter
        robot = declare('robot', 'so101').value
        if robot not in ROBOTS:
            raise ValueError(f"parameter 'robot' must be one of {', '.join(ROBOTS)}, got {robot!r}")
        camera_topic = declare('camera_topic', 'camera/front/image_raw').value
        camera_rate = self._camera_rate = declare('camera_rate_hz', 30.0).value
        physics_rate = declare('joint_state_rate_hz', 100.0).value
        control_rate = declare('control_rate_hz', 30.0).value
        interface = declare('command_interface', 'joint_trajectory').value
        command_topic = declare('command_topic', 'arm_controller/joint_trajectory').value
        # A forward position controller's topic and joints besides (the SO-101's gripper); '' for none.
        forward_topic = declare('forward_topic', 'gripper_controller/commands').value
        forward_joints = list(declare('forward_joints', ['gripper']).value)
        policy_node = declare('policy_node', '/vla_policy_node').value
        self.episodes = declare('episodes', 10).value
        self._max_steps = declare('max_steps', 90).value
        self._instruction_override = declare('instruction', '').value
        self._record = declare('record_prefix', '').value
        seed = declare('seed', 0).value
        self.duration = declare('duration', 0.0).value
        # true: one layout and no instruction of its own; a RunInstruction goal gives the task.
        self._goal_driven = declare('goal_driven', False).value
        self._env = make_env(robot, dt=1.0 / control_rate, max_steps=self._max_steps)
        self._joints = list(self._env.joint_names)
        self._env.reset(np.random.default_rng(seed + 1))           # the arm's first pose
        self._rng = np.random.default_rng(seed)
        # One follower per group of joints a controller drives, keyed by their indices.
        self._followers: dict[tuple[int, ...], TrajectoryFollower] = {}
        self._hold = self._env.q                       # where joints without a command stay
        self._forward = self._indices(forward_joints) if forward_topic else None
        self.reports: list[EpisodeReport] = []
        self.finished = False
        self._phase = 'waiting'
        self._episode_start = 0.0
        self._first_command: float | None = None
        self._success = False
        self._frames: list[tuple[float, np.ndarray]] = []     # (s into the episode, image)
        self._last_physics = time.monotonic()
        self._policy: dict[str, str] = {}                # the node's latest policy status
        # The node's status name, from its name resolved as the reset service's is (namespaces).
        self._policy_status = f"{status_prefix(self.resolve_service_name(policy_node))}: policy"
        self._waits_logged: set[str] = set()           # each wait is said once
        self._waiting_since = time.monotonic()
        self._joint_pub = self.create_publisher(JointState, '/joint_states', JOINT_STATES_QOS)
        self._camera_pub = self.create_publisher(Image, camera_topic, CAMERA_QOS)
        self._instruction_pub = self.create_publisher(String, 'instruction', INSTRUCTION_QOS)
        self._success_pub = self.create_publisher(TaskSuccess, 'task_success', COMMAND_QOS)
        self._node_episode: int | None = None          # the node's running episode (None: none, or it ended)
        self.create_subscription(Episode, f'{policy_node}/episode', self._on_node_episode, EPISODE_QOS)
        self._reset = self.create_client(Trigger, f'{policy_node}/reset_episode')
        if interface == 'joint_trajectory':
            self.create_subscription(JointTrajectory, command_topic, self._on_trajectory, COMMAND_QOS)
        else:       # one forward controller for every joint
            self._forward = tuple(range(len(self._joints)))
            self.create_subscription(Float64MultiArray, command_topic, self._on_forward, COMMAND_QOS)
        if forward_topic and interface == 'joint_trajectory':
            self.create_subscription(Float64MultiArray, forward_topic, self._on_forward, COMMAND_QOS)
        self.create_subscription(DiagnosticArray, '/diagnostics', self._on_diagnostics, DIAGNOSTICS_QOS)
        self.create_timer(1.0 / physics_rate, self._on_physics_tick)
        self.create_timer(1.0 / camera_rate, self._on_camera_tick)
        self.create_timer(1.0 / control_rate, self._on_episode_tick)

    # ------------------------------------------------------------------ commands
    def _on_trajectory(self, msg: JointTrajectory) -> None:
        if not msg.points:
            return
        joints = self._indices(list(msg.joint_names))
        if joints is None:
            return
        times = [p.time_from_start.sec + 1e-9 * p.time_from_start.nanosec for p in msg.points]
        try:
            points = np.asarray([p.positions for p in msg.points], dtype=np.float64)
        except ValueError:
            self.get_logger().warning('ignoring a trajectory whose points differ in length')
            return
        self._follow(joints, times, points)

    def _on_forward(self, msg: Float64MultiArray) -> None:
        if self._forward is not None:
            self._follow(self._forward, [self._env.dt], np.asarray(msg.data, dtype=np.float64)[None, :])

    def _indices(self, names: list[str]) -> tuple[int, ...] | None:
        """Return the indices of the named joints, or None (said in the log) when one is not this robot's."""
        unknown = [n for n in names if n not in self._joints]
        if unknown or not names:
            self.get_logger().warning(f'joints {names} are not among {self._joints}: command ignored',
                                      throttle_duration_sec=5.0)
            return None
        return tuple(self._joints.index(n) for n in names)

    def _follow(self, joints: tuple[int, ...], times: list[float], points: np.ndarray) -> None:
        now = time.monotonic()
        follower = TrajectoryFollower(len(joints))
        try:
            follower.set(now, self._env.q[list(joints)], np.asarray(times), points)
        except ValueError as error:
            self.get_logger().warning(f'ignoring command: {error}', throttle_duration_sec=5.0)
            return
        # A new controller group takes its joints from any group that drove them before.
        for other in [g for g in self._followers if g != joints and set(g) & set(joints)]:
            del self._followers[other]
        self._followers[joints] = follower
        if self._phase == 'running' and self._first_command is None:
            self._first_command = now

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        values = diagnostics_to_dict(msg).get(self._policy_status)
        if values is not None:
            self._policy = values

    def _on_node_episode(self, msg: Episode) -> None:
        self._node_episode = msg.episode if msg.event == Episode.STARTED else None

    def _node_ready(self) -> bool:
        """
        Tell whether the policy node can serve an episode: its reset service is up and it reports.

        A node with ``inference: remote`` also needs its server (``remote_servers_matched``):
        episodes started while the server still loads would fail for want of a policy.
        """
        if not self._reset.service_is_ready() or not self._policy:
            if time.monotonic() - self._waiting_since > 10.0:
                self._say_waiting(f"for the policy node: its reset service and its /diagnostics "
                                  f"status '{self._policy_status}'")
            return False
        if self._policy.get('remote_servers_matched', '1') == '0':
            self._say_waiting('for the policy server of the node')
            return False
        return True

    def _say_waiting(self, what: str) -> None:
        if what not in self._waits_logged:
            self._waits_logged.add(what)
            self.get_logger().info(f'waiting {what}')

    # ------------------------------------------------------------------ physics and sensors
    def _on_physics_tick(self) -> None:
        now = time.monotonic()
        target = self._hold.copy()
        for joints, follower in self._followers.items():
            desired = follower.desired(now)
            if desired is not None:
                target[list(joints)] = desired
        self._env.drive(target, now - self._last_physics)
        self._last_physics = now
        if self._phase == 'running' and self._env.success:      # a touch since the episode began
            self._success = True
        msg = JointState(name=self._joints, position=self._env.q.tolist())
        msg.header.stamp = self.get_clock().now().to_msg()
        self._joint_pub.publish(msg)

    def _on_camera_tick(self) -> None:
        frame = self._env.render()
        msg = rgb_to_image(frame, frame_id=f'{self._env.camera_name}_camera')
        msg.header.stamp = self.get_clock().now().to_msg()
        self._camera_pub.publish(msg)
        if self._phase == 'running' and self._record and not self.reports:
            self._frames.append((max(0.0, time.monotonic() - self._episode_start), frame))

    # ------------------------------------------------------------------ episodes
    def _on_episode_tick(self) -> None:
        if self._phase == 'waiting':
            if self._node_ready():
                self._start_episode()
            return
        if self._phase != 'running':
            return
        if self._env.is_touching() and self._node_episode is not None:     # a RunInstruction goal's success
            self._success_pub.publish(TaskSuccess(stamp=self.get_clock().now().to_msg(), episode=self._node_episode))
        if self._goal_driven:
            return
        steps = int((time.monotonic() - self._episode_start) / self._env.dt)
        if self._success or steps >= self._max_steps:
            self._finish_episode(min(steps, self._max_steps))

    def _start_episode(self) -> None:
        self._env.reset(self._rng, keep_pose=True)       # new blocks; the arm does not teleport
        self._followers.clear()
        self._hold = self._env.q
        self._on_camera_tick()                           # the new layout before the new task
        if self._goal_driven:
            print(f'task: {self._env.scene.instruction!r} (send it as a RunInstruction goal)', flush=True)
            self._phase = 'running'
            return
        sent = self._instruction_override or self._env.scene.instruction
        self._instruction_pub.publish(String(data=sent))
        self._reset.call_async(Trigger.Request())
        self._episode_start = time.monotonic()
        self._first_command = None
        self._success = False
        self._phase = 'running'

    def _finish_episode(self, steps: int) -> None:
        first = self._first_command
        report = EpisodeReport(
            instruction=self._env.scene.instruction,
            sent=self._instruction_override or self._env.scene.instruction,
            success=self._success, steps=steps,
            first_command_ms=float('nan') if first is None else 1e3 * (first - self._episode_start),
            policy_p50_ms=float(self._policy.get('total_latency_p50_ms', 'nan')))
        self.reports.append(report)
        print(format_report(len(self.reports), self.episodes, report), flush=True)
        if len(self.reports) == 1 and self._record:
            self._save_recording(report)
        if len(self.reports) >= self.episodes > 0:
            self._phase = 'done'
            self.finished = True
        else:
            self._start_episode()

    def _save_recording(self, report: EpisodeReport) -> None:
        if not self._frames:
            return
        gif, png = Path(self._record + '.gif'), Path(self._record + '.png')
        outcome = f"{'SUCCESS' if report.success else 'failure'} at {report.steps * self._env.dt:.2f} s"
        frames = [frame for _, frame in self._frames]
        captions = [f'{report.instruction}\nt {t:4.2f} s   {outcome}' for t, _ in self._frames]
        save_gif(frames, gif, 1.0 / self._camera_rate, captions=captions)
        save_strip(frames, png, captions=captions)
        print(f'saved the first episode: {gif.resolve()} and {png.resolve()}', flush=True)

    def summary(self) -> str:
        """Return the success rate line."""
        done = len(self.reports)
        wins = sum(r.success for r in self.reports)
        if not done:
            return 'no episode finished: is vla_policy_node running with the same ROS_DOMAIN_ID?'
        return f'{success_rate(wins, done)} (through vla_policy_node over DDS)'


def success_rate(wins: int, done: int) -> str:
    """Return the success rate line's start: ``success rate: 3/4 = 75%``."""
    return f'success rate: {wins}/{done} = {100.0 * wins / done:.0f}%'


def parse_success_rate(text: str) -> tuple[int, int] | None:
    """Return (successes, episodes) of the success rate line in ``text``, or None without one."""
    found = SUCCESS_RATE.search(text)
    return None if found is None else (int(found['wins']), int(found['done']))


def format_report(index: int, total: int, report: EpisodeReport) -> str:
    """One line per episode, for a person."""
    blind = '' if report.sent == report.instruction else f' (sent {report.sent!r})'
    # No command in the episode, or no /diagnostics yet (the node reports once per period).
    first = f'{report.first_command_ms:6.1f} ms' if np.isfinite(report.first_command_ms) else '  none'
    p50 = f'{report.policy_p50_ms:.1f} ms' if np.isfinite(report.policy_p50_ms) else 'not reported yet'
    return (f'episode {index:>3}/{total}: {report.instruction!r:<26}{blind} '
            f"{'SUCCESS' if report.success else 'failure'}  steps {report.steps:>3}  "
            f'first command {first}  policy p50 {p50}')


def main(args: list[str] | None = None) -> int:
    """Run ``episodes`` episodes (0 = until Ctrl-C or ``duration``), then print the success rate."""
    rclpy.init(args=args)
    robot = SimRobot()
    started = time.monotonic()
    try:
        while rclpy.ok() and not robot.finished and (
                robot.duration <= 0.0 or time.monotonic() - started < robot.duration):
            rclpy.spin_once(robot, timeout_sec=0.05)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except RuntimeError:            # RCLError: SIGTERM shut the context down between ok() and the wait
        if rclpy.ok():
            raise
    print(robot.summary(), flush=True)
    robot.destroy_node()
    rclpy.try_shutdown()
    return 0 if robot.finished or robot.episodes <= 0 else 1
