# SPDX-License-Identifier: Apache-2.0
"""
Closed-loop episodes without ROS: a policy drives a simulated robot (``sim.robots``) directly.

The loop does what the node does at ``chunking.refill_threshold`` r with no inference
delay: predict a chunk, execute its first ``(1 - r) * chunk`` actions, predict again.
Episodes run back to back from where the arm stopped, as on the ROS robot.
"""

from __future__ import annotations

from dataclasses import dataclass
import time
from typing import Callable, Optional

import numpy as np

ChunkFn = Callable[[dict], np.ndarray]
"""observation -> actions (chunk, J) in joint positions, both in the robot's units (radians)."""


@dataclass(frozen=True)
class EpisodeResult:
    """How one episode went."""

    instruction: str
    success: bool
    steps: int
    latency_ms: float          # mean time of one chunk prediction


def run_episode(env, chunk_fn: ChunkFn, execute: int, rng: np.random.Generator,
                instruction: Optional[str] = None) -> EpisodeResult:
    """One episode on a new layout, from where the arm is; ``instruction`` replaces the scene's."""
    if execute < 1:
        raise ValueError(f"execute must be >= 1, got {execute}")
    obs = env.reset(rng, keep_pose=True)
    task = env.scene.instruction
    done, success, latencies = False, False, []
    while not done:
        if instruction is not None:
            obs = {**obs, "task": instruction}
        start = time.perf_counter()
        chunk = np.asarray(chunk_fn(obs))
        latencies.append(time.perf_counter() - start)
        for action in chunk[:execute]:
            obs, success, done = env.step(action)
            if done:
                break
    return EpisodeResult(task, bool(success), env.steps, 1e3 * float(np.mean(latencies)))


def evaluate(env, chunk_fn: ChunkFn, episodes: int, seed: int, execute: int,
             instruction: Optional[str] = None,
             report: Optional[Callable[[int, EpisodeResult], None]] = None) -> list[EpisodeResult]:
    """
    Run ``episodes`` episodes on layouts drawn from ``seed``; ``report`` sees each result.

    The arm's first pose comes from ``seed + 1`` and every episode starts where the last
    ended, as on the ROS robot (``ros.sim.robot``): the same seed gives the same layouts.
    """
    env.reset(np.random.default_rng(seed + 1))
    rng = np.random.default_rng(seed)
    results = []
    for i in range(episodes):
        result = run_episode(env, chunk_fn, execute, rng, instruction=instruction)
        results.append(result)
        if report is not None:
            report(i, result)
    return results


def policy_chunk_fn(policy, env=None) -> ChunkFn:
    """
    Adapt a loaded ``Policy`` (batch 1) to a ``ChunkFn``.

    With ``env``, the state goes to the policy in its units (``env.to_policy``) and the
    actions come back in the robot's (``env.from_policy``), as the node's joint_units do.
    """
    if env is None:
        return lambda obs: policy.predict_action_chunk(obs)[0]

    def chunk(obs: dict) -> np.ndarray:
        state = env.to_policy(obs["state"]).astype(np.float32)
        return env.from_policy(policy.predict_action_chunk({**obs, "state": state})[0])
    return chunk


def success_rate(results: list[EpisodeResult]) -> float:
    return float(np.mean([r.success for r in results])) if results else float("nan")
