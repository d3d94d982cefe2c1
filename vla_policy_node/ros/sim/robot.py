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

Time: in lockstep (``lockstep``, the demo's) it keeps its own simulated time and publishes it
on ``/clock`` for a node with ``use_sim_time``: each step runs one control period of physics
(the controllers at ``joint_state_rate_hz`` inside it), publishes the joint states, the camera
when due and the new ``/clock``, then waits for the node's answer for that tick
(``<policy_node>/tick_done``), so the policy's latency costs no simulated time whatever the
CPU load (``ros/sim/lockstep.py``; after ``lockstep_timeout`` s of wall-clock time without an
answer it steps on in real time and counts the unanswered ticks). Before the node is ready
and after the episodes it steps in real time. In real time (``lockstep: false``) physics
follows the wall clock, as a real arm does, at most ``MAX_CATCH_UP_S`` per physics tick: a
simulator starved of CPU falls behind, and the episode line gives its real-time factor (in
lockstep too). A failed episode's line also gives the node's last hold reason in it, read
from its /diagnostics state.

CPU: the robot shares the machine with the policy node, so it wakes its executor as little as
it can: the controllers read their commands at each physics tick (``ros/sim/controllers.py``),
and in real time the physics ticks run on a thread of their own (``ros/sim/pacing.py``: no
executor wake per tick), which also runs the camera and the episode's tick when they are due
(``Cadence``) and so renders: the renderer's GL context is made and released on that thread.

Threads (real time): ``_lock`` is held by the physics tick and by each executor callback that
touches what the tick does (the episode, the node's status and episode, the controllers, the
env). Whoever reads the robot from outside without it (``finished``, ``reports``, ``_phase``,
``_policy``) gets a consistent value because these are only ever replaced whole or appended to.
A tick that raises ends the thread, is logged and re-raised from the executor's spin, as a
failing timer callback's exception is.
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from pathlib import Path
import re
import threading
import time
import traceback

from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray
import numpy as np
import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from std_srvs.srv import Trigger
from vla_policy_interfaces.msg import Episode, TaskSuccess

from vla_policy_node.ros.conversions import rgb_to_image
from vla_policy_node.ros.diagnostics import diagnostics_to_dict, status_prefix
from vla_policy_node.ros.qos import (CAMERA_QOS, CLOCK_QOS, COMMAND_QOS, DIAGNOSTICS_QOS, EPISODE_QOS,
                                     INSTRUCTION_QOS, JOINT_STATES_QOS, TICK_DONE_QOS)
from vla_policy_node.ros.sim.controllers import SimControllers
from vla_policy_node.ros.sim.lockstep import Cadence, Lockstep, RealTimeFactor
from vla_policy_node.ros.sim.pacing import PacedThread
from vla_policy_node.sim.recording import save_gif, save_strip
from vla_policy_node.sim.robots import make_env, ROBOTS

MAX_CATCH_UP_S = 0.1           # real time: the most physics one late physics tick runs
SIM_START_S = 1.0              # lockstep: the first /clock (a zero stamp means "not stamped")
SPIN_TIMEOUT_S = 0.2           # a spin returns at each callback; idle wakes of the executor cost CPU
HOLDING = 'holding: '
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
    real_time_factor: float = math.nan  # simulated s per wall-clock s over the episode
    hold: str = ''              # the node's last hold reason seen in the episode ('' none)
    unanswered: int = 0         # lockstep: steps taken without the node's answer (it was late)


class SimRobot(Node):
    """
    The simulated arm, its camera and the episode loop.

    Long (over 300 lines): the controllers, the sensors, the clock and the episodes all read and
    step the one simulation (physics, followers, phase), as a robot driver with ros2_control does.
    """

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
        # true: /clock and one control period per answer of the node (use_sim_time); false: real time.
        self._lockstep = declare('lockstep', False).value
        self._lock = threading.Lock()                   # real time: the physics thread's and the callbacks'
        self._physics: PacedThread | None = None
        self._physics_error: Exception | None = None
        self._pace = Lockstep(declare('lockstep_timeout', 5.0).value)
        self._env = make_env(robot, dt=1.0 / control_rate, max_steps=self._max_steps)
        self._joints = list(self._env.joint_names)
        self._env.reset(np.random.default_rng(seed + 1))           # the arm's first pose
        self._rng = np.random.default_rng(seed)
        self.reports: list[EpisodeReport] = []
        self.finished = False
        self._phase = 'waiting'
        self._episode_start = 0.0
        self._first_command: float | None = None
        self._success = False
        self._frames: list[tuple[float, np.ndarray]] = []     # (s into the episode, image)
        self._last_physics = time.monotonic()
        self._sim_time = SIM_START_S                     # s simulated (lockstep: /clock)
        self._substeps = max(1, math.ceil(physics_rate / control_rate - 1e-9))
        self._camera = Cadence(1.0 / camera_rate, self._now())
        self._episode_tick = Cadence(1.0 / control_rate, self._now())
        self._rtf = RealTimeFactor()
        self._reset_future = None                        # the episode's ~/reset_episode call
        self._hold_seen = ''
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
        self._controllers = SimControllers(self, self._joints, self._env.q, self._env.dt, interface, command_topic,
                                           forward_topic, forward_joints)
        self.create_subscription(DiagnosticArray, '/diagnostics', self._on_diagnostics, DIAGNOSTICS_QOS)
        self._keep_time(policy_node, physics_rate, camera_rate, control_rate)

    def _keep_time(self, policy_node: str, physics_rate: float, camera_rate: float, control_rate: float) -> None:
        """Lockstep: /clock, the node's answers and a real-time pacer; else timers on the wall clock."""
        if self._lockstep:
            self._clock_pub = self.create_publisher(Clock, '/clock', CLOCK_QOS)
            self.create_subscription(Time, f'{policy_node}/tick_done', self._on_tick_done, TICK_DONE_QOS)
            self._answered = self.create_guard_condition(self._on_answered)
            self.create_timer(1.0 / control_rate, self._on_pacer)
        else:       # a thread of physics ticks: the camera and the episode's tick run in it when due
            self._env.close()           # the first image's GL context is this thread's: the physics one makes its own
            self._physics_failed = self.create_guard_condition(self._on_physics_failed)
            self._physics = PacedThread('vla_policy_sim_physics', 1.0 / physics_rate, self._on_physics_tick,
                                        self._on_physics_error, release=self._env.close)
            self._physics.start()

    def _now(self) -> float:
        """Return the simulator's time: simulated in lockstep, else the wall clock (monotonic)."""
        return self._sim_time if self._lockstep else time.monotonic()

    def _stamp(self) -> Time:
        if not self._lockstep:
            return self.get_clock().now().to_msg()
        nanoseconds = int(round(self._sim_time * 1e9))
        return Time(sec=nanoseconds // 10**9, nanosec=nanoseconds % 10**9)

    # ------------------------------------------------------------------ commands
    def _take_commands(self) -> None:
        """Let the controllers read the commands that came since the last physics tick (their update)."""
        arrival = self._controllers.take(self._now(), self._env.q, arrived_now=self._lockstep)
        if (arrival is not None and self._phase == 'running' and self._first_command is None
                and arrival >= self._episode_start):
            self._first_command = arrival

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        values = diagnostics_to_dict(msg).get(self._policy_status)
        if values is not None:
            state = values.get('state', '')
            with self._lock:
                self._policy = values
                if self._phase == 'running' and state.startswith(HOLDING):
                    self._hold_seen = state[len(HOLDING):]

    def _on_node_episode(self, msg: Episode) -> None:
        with self._lock:
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
        """Real time (the physics thread): physics up to now; then the camera and the episode's tick when due."""
        with self._lock:
            self._take_commands()
            now = time.monotonic()
            seconds = min(now - self._last_physics, MAX_CATCH_UP_S)
            self._env.drive(self._controllers.target(now), seconds)
            self._sim_time += seconds
            self._last_physics = now
            self._after_physics()
            if self._camera.due(now):
                self._on_camera_tick()
            if self._episode_tick.due(now):
                self._on_episode_tick()

    def _on_physics_error(self, error: Exception) -> None:
        """Say that the physics thread failed and raise it from the executor's spin (quiet when ROS shut down)."""
        if not self.context.ok():
            return                      # the process ends: its context went first (Ctrl-C, SIGTERM)
        self._physics_error = error
        self.get_logger().error('the physics thread failed, the simulation stops:\n'
                                + ''.join(traceback.format_exception(error)))
        self._physics_failed.trigger()

    def _on_physics_failed(self) -> None:
        raise self._physics_error

    def _after_physics(self) -> None:
        if self._phase == 'running' and self._env.success:      # a touch since the episode began
            self._success = True
        msg = JointState(name=self._joints, position=self._env.q.tolist())
        msg.header.stamp = self._stamp()
        self._joint_pub.publish(msg)

    # ------------------------------------------------------------------ lockstep
    def _step(self) -> None:
        """
        Run one control period of physics and the episode's tick; publish the sensors and the new /clock.

        In an episode the sensors go out first, so the node's tick that the /clock starts sees
        them (their stamps are then one period ahead of the node's clock until it arrives,
        which the node accepts). Otherwise the /clock goes first: a node just started has heard
        no /clock yet and would refuse stamps seconds ahead of its zero.
        """
        self._take_commands()
        start, dt = self._sim_time, self._env.dt
        for i in range(1, self._substeps + 1):
            self._env.drive(self._controllers.target(start + i * dt / self._substeps), dt / self._substeps)
        self._sim_time = start + dt
        self._pace.stepped(self._sim_time)
        running = self._phase == 'running'
        if not running:
            self._clock_pub.publish(Clock(clock=self._stamp()))
        self._after_physics()
        self._on_episode_tick()
        if self._camera.due(self._sim_time):
            self._on_camera_tick()
        if running:
            self._clock_pub.publish(Clock(clock=self._stamp()))

    def _on_tick_done(self, msg: Time) -> None:
        late = self._pace.late
        if self._resetting():
            return              # a tick before the episode's reset answers nothing of it
        if self._pace.answer(msg.sec + 1e-9 * msg.nanosec):
            if late:
                self.get_logger().info('the policy node answers again: lockstep resumed')
            self._answered.trigger()

    def _resetting(self) -> bool:
        return self._reset_future is not None and not self._reset_future.done()

    def _on_reset_done(self) -> None:
        """Take the node's reset as its answer to the episode's first tick."""
        self._pace.answer(math.inf)
        self._answered.trigger()

    def _on_answered(self) -> None:
        """Step once the node answered the tick (in a guard, out of the answer's callback)."""
        if self._phase == 'running' and self._pace.answered:
            self._step()

    def _on_pacer(self) -> None:
        """Real time while no episode runs (the node's timers need /clock) or while the node is late."""
        if self._phase == 'running':
            if not self._pace.overdue():
                return
            if self._pace.unanswered == 0:
                self.get_logger().warning(
                    f'the policy node did not answer the tick at {self._sim_time:.3f} s (sim time) within '
                    f'{self._pace.timeout:g} s: stepping on in real time until it does (does it run with '
                    'use_sim_time?)', throttle_duration_sec=10.0)
        self._step()

    def _on_camera_tick(self) -> None:
        frame = self._env.render()
        msg = rgb_to_image(frame, frame_id=f'{self._env.camera_name}_camera')
        msg.header.stamp = self._stamp()
        self._camera_pub.publish(msg)
        if self._phase == 'running' and self._record and not self.reports:
            self._frames.append((max(0.0, self._now() - self._episode_start), frame))

    # ------------------------------------------------------------------ episodes
    def _on_episode_tick(self) -> None:
        if self._phase == 'waiting':
            if self._node_ready():
                self._start_episode()
            return
        if self._phase != 'running':
            return
        if self._env.is_touching() and self._node_episode is not None:     # a RunInstruction goal's success
            self._success_pub.publish(TaskSuccess(stamp=self._stamp(), episode=self._node_episode))
        if self._goal_driven:
            return
        steps = int((self._now() - self._episode_start) / self._env.dt + 1e-6)
        if self._success or steps >= self._max_steps:
            self._finish_episode(min(steps, self._max_steps))

    def _start_episode(self) -> None:
        self._env.reset(self._rng, keep_pose=True)       # new blocks; the arm does not teleport
        self._controllers.hold(self._env.q)
        self._on_camera_tick()                           # the new layout before the new task
        self._camera.restart(self._now())
        if self._goal_driven:
            print(f'task: {self._env.scene.instruction!r} (send it as a RunInstruction goal)', flush=True)
            self._phase = 'running'
            return
        sent = self._instruction_override or self._env.scene.instruction
        self._instruction_pub.publish(String(data=sent))
        self._reset_future = self._reset.call_async(Trigger.Request())
        self._episode_start = self._now()
        self._rtf.start(self._sim_time)
        if self._lockstep:          # the first step waits for the node's reset
            self._pace.wait_again()
            self._reset_future.add_done_callback(lambda _: self._on_reset_done())
        self._hold_seen = ''
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
            policy_p50_ms=float(self._policy.get('total_latency_p50_ms', 'nan')),
            real_time_factor=self._rtf.factor(self._sim_time), hold=self._hold_seen,
            unanswered=self._pace.unanswered)
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

    def destroy_node(self) -> None:
        """Stop the physics thread; destroy the command subscriptions (they keep the node's handle), node, env."""
        if getattr(self, '_physics', None) is not None:
            self._physics.stop()
        if hasattr(self, '_controllers'):
            self._controllers.destroy()
        super().destroy_node()
        if hasattr(self, '_env'):          # not when a parameter was refused
            self._env.close()

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
    rtf = f'  real-time factor {report.real_time_factor:.2f}' if np.isfinite(report.real_time_factor) else ''
    late = f'  unanswered ticks {report.unanswered}' if report.unanswered else ''
    held = f'  node held: {report.hold[:160]}' if report.hold and not report.success else ''
    return (f'episode {index:>3}/{total}: {report.instruction!r:<26}{blind} '
            f"{'SUCCESS' if report.success else 'failure'}  steps {report.steps:>3}  "
            f'first command {first}  policy p50 {p50}{rtf}{late}{held}')


def spin_episodes(robot: SimRobot) -> None:
    """Spin ``robot`` until its episodes or its ``duration`` are over, Ctrl-C or SIGTERM."""
    started = time.monotonic()
    try:
        while rclpy.ok() and not robot.finished and (
                robot.duration <= 0.0 or time.monotonic() - started < robot.duration):
            rclpy.spin_once(robot, timeout_sec=SPIN_TIMEOUT_S)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except RuntimeError:            # RCLError: SIGTERM shut the context down between ok() and the wait
        if rclpy.ok():
            raise


def main(args: list[str] | None = None) -> int:
    """Run ``episodes`` episodes (0 = until Ctrl-C or ``duration``), then print the success rate."""
    rclpy.init(args=args)
    robot = SimRobot()
    try:
        spin_episodes(robot)
        print(robot.summary(), flush=True)
    finally:                        # the physics thread ends with the node, also when a tick raised
        robot.destroy_node()
        rclpy.try_shutdown()
    return 0 if robot.finished or robot.episodes <= 0 else 1
