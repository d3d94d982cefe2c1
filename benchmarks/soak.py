# SPDX-License-Identifier: Apache-2.0
"""
Soak test: 10,000 real-time control steps of the tiny policy against a simulated robot.

It runs the node's control loop without ROS: ``control.loop.ControlLoop`` (input health,
chunk scheduling, holds, the clamp and the one exit for commands) with the policy on its
inference thread (``control.inference.InferenceWorker``), against a first-order robot that
renders synthetic camera frames. The loop ticks on the wall clock at ``--rate-hz`` (default:
the node's maximum, 1000 Hz); episodes end every few hundred steps (sometimes with a burst of
resets), each with a new instruction.

Per 1000-step window it reports control-step latency percentiles, tick lateness, dropped
commands (ticks with no action after the episode's first chunk: the robot holds), late
commands (published more than one period after their slot), inference latency, chunks
discarded because their episode had ended, RSS and the number of live ``VLAPrefixCache``
objects (found through the garbage collector). Every command the loop publishes is checked
against the limits, the step limit and the age of its observation. It exits 1 if more caches
are alive than ``--max-caches``, if any command broke a limit, or if inference failed.

Run: ``python -m benchmarks.soak [--steps 10000] [--rate-hz 1000]``.
"""

from __future__ import annotations

import argparse
import gc
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from vla_policy_node.control.chunking import SchedulerConfig
from vla_policy_node.control.loop import ControlLoop, LoopSettings
from vla_policy_node.control.inference import InferenceWorker
from vla_policy_node.model.prefix_cache import VLAPrefixCache
from vla_policy_node.control.safety import MotionLimits
from vla_policy_node.loading import Policy, build_tiny_policy

CAMERAS = ("front", "wrist")
TASKS = ("pick up the red cube", "open the drawer", "stack the blocks", "wave")


def rss_mib() -> tuple[float, float]:
    """Return the (current, peak) resident set size of this process in MiB, from /proc."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def live_prefix_caches() -> int:
    """Count the ``VLAPrefixCache`` objects alive anywhere in the process."""
    gc.collect()
    return sum(type(o) is VLAPrefixCache for o in gc.get_objects())   # type(): no lazy module attributes


class SimRobot:
    """First-order joints that follow commands at a bounded speed; frames drawn from the pose."""

    def __init__(self, num_joints: int, max_velocity: float, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.position = np.zeros(num_joints)
        self.max_velocity = max_velocity
        self._grid = np.linspace(0.0, 1.0, 48 * 64).reshape(48, 64)

    def observe(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        frames = {}
        for i, name in enumerate(CAMERAS):
            phase = self._grid + self.position[i % len(self.position)]
            level = (127.5 * (1.0 + np.sin(6.0 * phase + i))).astype(np.uint8)
            frames[name] = np.repeat(level[:, :, None], 3, axis=2)
        return frames, self.position + self.rng.normal(0.0, 1e-4, self.position.shape)

    def apply(self, command: np.ndarray, dt: float) -> None:
        step = np.clip(command - self.position, -self.max_velocity * dt, self.max_velocity * dt)
        self.position = self.position + step


@dataclass
class Window:
    """Figures of one window of control steps."""

    step_ms: list[float] = field(default_factory=list)       # tick processing time
    lateness_ms: list[float] = field(default_factory=list)   # command time - slot time
    dropped: int = 0
    waiting: int = 0
    late: int = 0
    resets: int = 0

    def row(self, index: int, counters: dict[str, int], inf: list[float], rss: float, caches: int) -> str:
        step = np.percentile(self.step_ms, [50, 95, 99]) if self.step_ms else [np.nan] * 3
        lateness = np.percentile(self.lateness_ms, [50, 99]) if self.lateness_ms else [np.nan] * 2
        return (f"| {index} | {step[0]:.3f} / {step[1]:.3f} / {step[2]:.3f} / {max(self.step_ms, default=0):.2f} "
                f"| {lateness[0]:.3f} / {lateness[1]:.2f} | {inf[0]:.2f} / {inf[1]:.2f} | {self.dropped} | "
                f"{self.late} | {self.waiting} | {self.resets} | {counters['chunks_discarded']} | {rss:.1f} "
                f"| {caches} |")


class Soak:
    """The control loop against the robot; the loop's sink moves the robot and checks each command."""

    def __init__(self, policy: Policy, args: argparse.Namespace) -> None:
        self.args = args
        self.period = 1.0 / args.rate_hz
        dim = policy.state_dim
        self.limits = MotionLimits(np.full(dim, -3.14), np.full(dim, 3.14), np.full(dim, 2.0), 0.1)
        self.robot = SimRobot(dim, 2.0, args.seed)
        self.worker = InferenceWorker(policy, None, time.perf_counter, deadline=5.0)
        settings = LoopSettings(joint_names=tuple(f"j{i}" for i in range(dim)), camera_names=CAMERAS,
                                control_rate_hz=args.rate_hz, limits=self.limits, plan_points=1,
                                max_observation_age=0.5)
        self.loop = ControlLoop(settings, SchedulerConfig(control_rate_hz=args.rate_hz, horizon=policy.chunk_size),
                                self.worker, self.publish)
        self.rng = np.random.default_rng(args.seed)
        self.main = threading.current_thread()
        self.counters = {"commands": 0, "outside_limits": 0, "over_max_step": 0, "over_wall_clock_step": 0,
                         "stale": 0}
        self.loop_horizon = policy.chunk_size
        self.previous: np.ndarray | None = None
        self.previous_at = 0.0
        self.tick_now = 0.0             # the loop clock of the tick running (messages may leave from a result too)

    def publish(self, points: np.ndarray, obs_times: np.ndarray | None, joints: np.ndarray | None) -> None:
        """Check a command of the loop (its sink) against every limit and its age, then move the robot (one topic)."""
        command = points[0]
        max_delta = self.limits.max_delta(self.period) + 1e-12
        if not np.all(np.isfinite(command)) or not self.limits.contains(command):
            self.counters["outside_limits"] += 1
        if self.previous is not None and np.any(np.abs(command - self.previous) > max_delta):
            self.counters["over_max_step"] += 1
        now = max(self.tick_now, time.perf_counter() if threading.current_thread() is not self.main else 0.0)
        # In loop-clock time: max_velocity times the time since the last message, plus one period's
        # allowance (a message may stop the setpoint where the controllers are, short of the last one).
        if self.previous is not None and np.any(np.abs(command - self.previous)
                                                > self.limits.max_velocity * (now - self.previous_at) + max_delta):
            self.counters["over_wall_clock_step"] += 1
        self.previous_at = now
        age_limit = self.loop.settings.action_age_limit(self.loop_horizon)
        if obs_times is not None and time.perf_counter() - obs_times[0] > age_limit:
            self.counters["stale"] += 1
        self.counters["commands"] += 1
        self.previous = command
        self.robot.apply(command, self.period)

    def new_episode(self) -> int:
        """Reset (a burst of 1-3 resets) with a new instruction; returns the next episode length."""
        for _ in range(1 if self.rng.random() < 0.75 else 3):
            self.loop.reset_episode("soak episode")
        self.loop.on_instruction(TASKS[self.rng.integers(len(TASKS))])
        return int(self.rng.integers(self.args.episode_steps // 2, self.args.episode_steps * 3 // 2 + 1))

    def tick(self, now: float) -> None:
        frames, state = self.robot.observe()
        for name, frame in frames.items():
            self.loop.on_image(name, frame, now, None)
        self.loop.on_joint_state(self.loop.settings.joint_names, state, now, None)
        self.tick_now = now
        self.loop.tick(now)

    def run(self) -> int:
        args = self.args
        self.worker.start()
        header = ("| window | step p50 / p95 / p99 / max ms | lateness p50 / p99 ms | inference p50 / p95 ms "
                  "| dropped | late | waiting | resets | discarded (total) | RSS MiB | live caches |")
        print(header)
        print("|" + "---|" * (header.count("|") - 1))
        rss0, _ = rss_mib()
        rss_first = None
        max_caches = 0
        episode_left = self.new_episode()
        window = Window()
        seen = self.loop.status(0.0, 1.0).counters
        start = time.perf_counter()
        slot = start
        for k in range(args.steps):
            if episode_left == 0:
                episode_left = self.new_episode()
                window.resets += 1
            episode_left -= 1
            delay = slot - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            now = time.perf_counter()
            self.tick(now)
            done = time.perf_counter()
            window.step_ms.append((done - now) * 1000)
            window.lateness_ms.append((done - slot) * 1000)
            if done - slot > self.period:
                window.late += 1
            slot = max(slot + self.period, done - self.period)   # never queue a burst of catch-up ticks
            if (k + 1) % args.window == 0 or k + 1 == args.steps:
                rss, _ = rss_mib()
                caches = live_prefix_caches()
                max_caches = max(max_caches, caches)
                rss_first = rss if rss_first is None else rss_first
                counters = self.loop.status(time.perf_counter(), 1.0).counters
                window.dropped = counters["starved_ticks"] - seen["starved_ticks"]
                window.waiting = counters["waiting_ticks"] - seen["waiting_ticks"]
                infer = self.worker.stats["latencies"]["total"]
                seen = counters
                print(window.row((k + 1) // args.window, counters, [v * 1e3 for v in infer], rss, caches), flush=True)
                window = Window()
                slot = max(slot, time.perf_counter())   # the measurement pause is not the loop's lateness
        elapsed = time.perf_counter() - start
        self.loop.stop(time.perf_counter())
        self.worker.stop(timeout=5.0)
        rss, peak = rss_mib()
        counters = self.loop.status(time.perf_counter(), 1.0).counters
        policy_counters = self.worker.stats["counters"]
        print(f"\n{args.steps} steps in {elapsed:.1f} s ({args.steps / elapsed:.0f} Hz achieved, "
              f"{args.rate_hz:g} Hz asked); RSS {rss0:.1f} MiB after warm-up, {rss_first:.1f} after the first window, "
              f"{rss:.1f} at the end, "
              f"peak {peak:.1f} (growth over warm-up {peak - rss0:.1f} MiB, after the first window "
              f"{rss - rss_first:+.1f} MiB)")
        print(f"live prefix caches: at most {max_caches} (limit {args.max_caches}); loop {counters}; "
              f"policy {policy_counters}; soak {self.counters}")
        failures = []
        if max_caches > args.max_caches:
            failures.append(f"{max_caches} live prefix caches > {args.max_caches}")
        violations = sum(self.counters[key] for key in ("outside_limits", "over_max_step", "over_wall_clock_step",
                                                        "stale"))
        if violations:
            failures.append(f"{violations} commands broke a limit, the step limit or the age limit")
        faults = {key: value for key, value in counters.items()   # stale: the loop refusing a slow chunk
                  if key.startswith("policy_") and key != "policy_stale" and value}
        if faults:
            failures.append(f"inference faults: {faults}")
        if policy_counters["prefix_passes"] != policy_counters["control_steps"]:
            failures.append("prefix passes != control steps")
        for failure in failures:
            print(f"FAIL: {failure}")
        return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000, help="control steps to run")
    parser.add_argument("--rate-hz", type=float, default=1000.0, help="control rate (the node allows 1 to 1000)")
    parser.add_argument("--episode-steps", type=int, default=300, help="mean episode length in steps")
    parser.add_argument("--window", type=int, default=1000, help="steps per reported window")
    parser.add_argument("--max-caches", type=int, default=1, help="allowed live VLAPrefixCache objects")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.rate_hz <= 0 or args.episode_steps < 2 or args.window < 1:
        parser.error("--steps, --rate-hz, --window must be positive and --episode-steps >= 2")
    torch.set_num_threads(args.threads)
    policy = build_tiny_policy(camera_names=CAMERAS, state_dim=6, action_dim=6)
    policy.warmup(policy.dummy_observation())
    print(f"soak: {policy.describe()} (random weights); {args.steps} steps at {args.rate_hz:g} Hz, "
          f"episodes of ~{args.episode_steps} steps\n")
    return Soak(policy, args).run()


if __name__ == "__main__":
    raise SystemExit(main())
