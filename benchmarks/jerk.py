# SPDX-License-Identifier: Apache-2.0
"""
Jerk at chunk boundaries, per blend mode, in a deterministic simulation.

A real policy's consecutive chunks disagree a little (offset, drift), so switching
chunks puts a kink in the command stream; this measures how much each blend mode
smooths it. The simulated policy is an exact flow-matching sampler for a Gaussian
action distribution: mean = a smooth reference trajectory from the request step on,
covariance = smooth per-chunk offset/drift/curvature. It samples in normalized action
space (reference mean 0, std 1 per joint) like a VLA, so it can be RTC-guided with
``model.rtc`` (the committed prefix normalized first, as the policy must do). Being
an exact posterior, its Jacobian is that of a calibrated, confident model, so the
guidance pulls weakly when chunks disagree little (see the spread table). The
control loop runs on a simulated clock with latency jitter and timer jitter; the
node holds the last command when starved.

Jerk = third difference of published commands (rad per step^3, 2-norm over joints),
reported at chunk boundaries (the 3 differences spanning each switch) and overall.

Run: ``python -m benchmarks.jerk``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vla_policy_node.control.chunking import ChunkRequest, ChunkScheduler, SchedulerConfig
from vla_policy_node.model.rtc import rtc_guided_velocity


@dataclass(frozen=True)
class JerkSimConfig:
    """Simulation settings; defaults: SmolVLA-like latency at a 30 Hz control rate."""

    control_rate_hz: float = 30.0
    horizon: int = 32
    refill_threshold: float = 0.5
    latency_s: float = 0.086
    latency_jitter: float = 0.3  # latency uniform in latency_s * (1 +- jitter)
    startup_latency_s: float = 0.5
    tick_jitter: float = 0.05  # tick time +- this fraction of a period
    duration_s: float = 60.0
    action_dim: int = 2
    chunk_spread: float = 0.05  # rad, std of a chunk's offset / drift / curvature
    num_flow_steps: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        if self.control_rate_hz <= 0 or self.horizon < 4 or self.duration_s <= 0:
            raise ValueError("control_rate_hz and duration_s must be > 0, horizon >= 4")
        if not 0 <= self.latency_jitter < 1 or not 0 <= self.tick_jitter < 0.5:
            raise ValueError("need 0 <= latency_jitter < 1 and 0 <= tick_jitter < 0.5")
        if self.latency_s < 0 or self.startup_latency_s < 0 or self.chunk_spread < 0:
            raise ValueError("latencies and chunk_spread must be >= 0")
        if self.action_dim < 1 or self.num_flow_steps < 1:
            raise ValueError("action_dim and num_flow_steps must be >= 1")


AMPLITUDE = 0.4  # rad; the reference's std per joint is AMPLITUDE / sqrt(2)
ACTION_STD = AMPLITUDE / np.sqrt(2.0)


def reference(steps: np.ndarray, rate_hz: float, action_dim: int) -> np.ndarray:
    """Smooth joint trajectory (T, action_dim) in rad: slow sinusoids, ~0.6 rad/s peak."""
    t = np.asarray(steps, dtype=np.float64)[:, None] / rate_hz
    joint = np.arange(action_dim)[None, :]
    return AMPLITUDE * np.sin(2 * np.pi * (0.2 + 0.05 * joint) * t + joint)


class GaussianChunkPolicy:
    """
    Flow-matching sampler whose normalized actions per joint are N(mean (H,), B B^T + eps I).

    With x_t = t z + (1 - t) a, the exact velocity is v = (x_t - E[a | x_t]) / t and
    E[a | x_t] = mean + G_t (x_t - (1 - t) mean), G_t = (1-t) S ((1-t)^2 S + t^2 I)^-1.
    """

    def __init__(self, sim: JerkSimConfig) -> None:
        self.sim = sim
        h = sim.horizon
        s = np.linspace(0.0, 1.0, h)
        basis = sim.chunk_spread / ACTION_STD * np.stack([np.ones(h), s, s**2 - s], axis=1)  # (H, 3)
        cov = basis @ basis.T + 1e-8 * np.eye(h)
        gains = []
        for k in range(sim.num_flow_steps):
            t = 1.0 - k / sim.num_flow_steps
            gains.append((1 - t) * cov @ np.linalg.inv((1 - t) ** 2 * cov + t**2 * np.eye(h)))
        self.gains = torch.as_tensor(np.stack(gains))  # (num_steps, H, H)

    def __call__(self, request: ChunkRequest) -> np.ndarray:
        """Chunk (H, A) for a request; RTC-guided when the request carries guidance."""
        sim = self.sim
        steps = request.step + np.arange(sim.horizon)
        mean = torch.as_tensor(reference(steps, sim.control_rate_hz, sim.action_dim) / ACTION_STD)
        noise = torch.randn(
            sim.horizon, sim.action_dim, dtype=torch.float64,
            generator=torch.Generator().manual_seed(sim.seed * 100_003 + request.request_id),
        )

        def velocity_fn(x: torch.Tensor, k: int) -> torch.Tensor:
            t = 1.0 - k / sim.num_flow_steps
            clean = mean + self.gains[k] @ (x - (1 - t) * mean)
            return (x - clean) / t

        if request.rtc is not None:
            guidance = request.rtc
            velocity_fn = rtc_guided_velocity(
                velocity_fn,
                guidance.prefix / ACTION_STD,
                guidance.delay_steps,
                sim.num_flow_steps,
                guidance.max_guidance_weight,
            )
        x = noise
        with torch.no_grad():
            for k in range(sim.num_flow_steps):
                x = x - velocity_fn(x, k) / sim.num_flow_steps
        return x.numpy() * ACTION_STD


def simulate(sim: JerkSimConfig, scheduler_config: SchedulerConfig) -> dict[str, float]:
    """Run the control loop; return jerk and step metrics of the published commands."""
    policy = GaussianChunkPolicy(sim)
    rng = np.random.default_rng(sim.seed)
    period = 1.0 / sim.control_rate_hz
    sched = ChunkScheduler(scheduler_config)
    commands, boundaries, in_flight, last = [], [], None, None
    for k in range(int(sim.duration_s * sim.control_rate_hz)):
        now = k * period + sim.tick_jitter * period * rng.uniform(-1, 1)
        if in_flight is not None and in_flight[0] <= now:
            sched.submit_chunk(in_flight[1], policy(in_flight[1]), in_flight[0])
            boundaries.append(len(commands))
            in_flight = None
        action = sched.next_action(now)
        last = action if action is not None else last
        if last is not None:
            commands.append(last)
        if sched.needs_chunk():
            request = sched.begin_request(now)
            jitter = 1 + sim.latency_jitter * rng.uniform(-1, 1)
            latency = sim.startup_latency_s if request.request_id == 0 else sim.latency_s * jitter
            in_flight = (now + latency, request)
    c = np.array(commands)
    jerk = np.linalg.norm(c[3:] - 3 * c[2:-1] + 3 * c[1:-2] - c[:-3], axis=1)
    at_boundary = np.array([jerk[b - 3:b] for b in boundaries[1:] if 3 <= b <= len(jerk)]).ravel()
    return {
        "boundary_max": float(at_boundary.max()),
        "boundary_rms": float(np.sqrt(np.mean(at_boundary**2))),
        "overall_max": float(jerk.max()),
        "overall_rms": float(np.sqrt(np.mean(jerk**2))),
        "max_step": float(np.linalg.norm(np.diff(c, axis=0), axis=1).max()),
        "starved_ticks": sched.stats["starved_ticks"],
        "chunks": sched.stats["chunks_received"],
    }


def scenarios(sim: JerkSimConfig) -> dict[str, SchedulerConfig]:
    """Name the rows of the table: each blend mode, plus synchronous execution."""
    base = dict(control_rate_hz=sim.control_rate_hz, horizon=sim.horizon, refill_threshold=sim.refill_threshold)
    rows = {
        "latest (no blending)": SchedulerConfig(**base, blend="latest"),
        "weighted (w=0.5)": SchedulerConfig(**base, blend="weighted", blend_weight=0.5),
        "temporal_ensemble (m=0.1)": SchedulerConfig(**base, blend="temporal_ensemble", ensemble_decay=0.1),
        "rtc (beta=10)": SchedulerConfig(**base, blend="rtc", rtc_max_guidance_weight=10.0),
    }
    rows["synchronous (refill at 0, latest)"] = SchedulerConfig(**{**base, "refill_threshold": 0.0})
    return rows


def jerk_table(sim: JerkSimConfig) -> str:
    """Markdown table of the metrics per scenario (jerk and steps in mrad)."""
    lines = [
        f"Simulated {sim.duration_s:.0f} s at {sim.control_rate_hz:.0f} Hz, horizon {sim.horizon}, refill at "
        f"{sim.refill_threshold:.0%}, latency {sim.latency_s * 1e3:.0f} ms +-{sim.latency_jitter:.0%}, "
        f"tick jitter +-{sim.tick_jitter:.0%}, chunk spread {sim.chunk_spread * 1e3:.0f} mrad, seed {sim.seed}.",
        "Jerk = |third difference| of published commands, mrad/step^3; boundary = the 3 differences spanning "
        "each chunk switch.",
        "",
        "| mode | boundary max | boundary RMS | overall max | overall RMS | max step (mrad) | starved ticks |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, config in scenarios(sim).items():
        m = simulate(sim, config)
        lines.append(
            f"| {name} | {m['boundary_max'] * 1e3:.2f} | {m['boundary_rms'] * 1e3:.2f} | {m['overall_max'] * 1e3:.2f} "
            f"| {m['overall_rms'] * 1e3:.2f} | {m['max_step'] * 1e3:.1f} | {m['starved_ticks']} |"
        )
    return "\n".join(lines)


def spread_table(sim: JerkSimConfig, spreads_rad: tuple[float, ...] = (0.02, 0.05, 0.1)) -> str:
    """Boundary jerk RMS (mrad/step^3) per scenario as consecutive chunks disagree more."""
    header = " | ".join(f"{s * 1e3:.0f} mrad" for s in spreads_rad)
    lines = [f"| mode \\ chunk spread | {header} |", "|---|" + "---:|" * len(spreads_rad)]
    results = {}
    for spread in spreads_rad:
        varied = JerkSimConfig(**{**sim.__dict__, "chunk_spread": spread})
        for name, config in scenarios(varied).items():
            results.setdefault(name, []).append(simulate(varied, config)["boundary_rms"] * 1e3)
    for name, values in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.1f}" for v in values) + " |")
    return "\n".join(lines)


def main() -> None:
    """Print the tables that go into BENCHMARKS.md."""
    sim = JerkSimConfig()
    print(jerk_table(sim))
    print()
    print("Boundary jerk RMS vs. disagreement between consecutive chunks:")
    print()
    print(spread_table(sim))


if __name__ == "__main__":
    main()
