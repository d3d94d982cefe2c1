# SPDX-License-Identifier: Apache-2.0
"""
Closed loop at full size: a random-weight SmolVLA (smolvla_base's geometry) drives the simulated SO-101 in real time.

The installed node runs as a subprocess on ``vla-policy-bench``'s random ``smolvla`` checkpoint
(SmolVLM2-500M cut to 16 layers, one camera, chunk 50, 10 steps) with config/default.yaml,
so101.yaml and demo.yaml, at 30 Hz with 50-action chunks; this process runs the simulated
SO-101 (``ros.sim.robot``: MuJoCo physics on the wall clock, not lockstep) on the same
2 cores, one episode of ``--duration`` seconds. The tracking check is off: random weights
command arbitrary motions, and the question here is time, not the task. ``max_observation_age``
is raised to 10 s (its maximum): a chunk that arrives later than that after its observation
is refused (default 0.5 s: every multi-second chunk would be). Reported from the
node's /diagnostics (counted from the episode's start): control ticks, starved ticks (ticks
after the episode's first chunk with no action to execute), waiting ticks (before it), holds
by reason and the node's real-time verdict (from its log), and chunk latency p50/p95 (each chunk
the node received).

LeRobot's column: the chunk latencies LeRobot 0.6.1 measured in a ``vla-policy-bench smolvla
--json`` run (``--lerobot-json``, the ``lerobot.seconds`` list) fed to the same scheduler on a
simulated clock (``bench.schedule``), with the node's own latencies fed the same way beside
it to show the simulation agrees with the real run.

    python -m benchmarks.closed_loop --dtype int8 --lerobot-json /tmp/smolvla_int8.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from vla_policy_node.ament_registration import installed_executable
from vla_policy_node.bench import checkpoints
from vla_policy_node.bench.dds import ros_env
from vla_policy_node.bench.measure import publish
from vla_policy_node.bench.schedule import simulate
from vla_policy_node.control.real_time import refill_threshold_for
from vla_policy_node.ros.sim.evaluation import package_config

RATE_HZ, HORIZON = 30.0, 50
LOG_LINE = re.compile(r"\[WARN\] \[(\d+\.\d+)\] \[[^\]]*vla_policy_node\]: (.*)")
REAL_TIME_WARNING = re.compile(
    r"^(too slow for real time|chunking\.refill_threshold \S+ is too low|chunking\.refill_from_latency asks)")
COUNTERS = ("control_ticks", "starved_ticks", "waiting_ticks", "chunks_received", "holds_published",
            "actions_skipped")


def node_overrides(path: Path, checkpoint: Path, args: argparse.Namespace) -> None:
    """Write the benchmark's parameters over demo.yaml's (JSON is YAML)."""
    params = {"/**/vla_policy_node": {"ros__parameters": {
        "checkpoint": str(checkpoint), "dtype": args.dtype, "device": "cpu", "num_threads": args.threads,
        "compile": args.compile, "trace": not args.no_trace, "camera_names": ["cam0"], "control_rate_hz": RATE_HZ,
        "diagnostics_period": 0.5,
        "policy_deadline": 10.0, "max_observation_age": args.max_observation_age,
        "chunking": {"horizon": HORIZON, "refill_threshold": args.refill_threshold,
                     "refill_from_latency": args.refill_from_latency, "blend": args.blend},
        "limits": {"max_tracking_error": [0.0] * 6},
    }}}
    path.write_text(json.dumps(params))


def counters(values: dict[str, str]) -> dict[str, int]:
    return {k: int(values[k]) for k in COUNTERS if k in values}


def drive(files: list[str], args: argparse.Namespace, log: Path) -> dict:
    """Start the node, run the simulated robot for one episode of ``--duration`` s, return the node's figures."""
    import rclpy
    from rclpy.parameter import Parameter

    from vla_policy_node.ros.sim.robot import SimRobot

    with open(log, "w") as out:
        node = subprocess.Popen([str(installed_executable()), "--ros-args", *(a for f in files for a in
                                                                              ("--params-file", f))],
                                env=ros_env(args.domain_id), stdout=out, stderr=subprocess.STDOUT)
    os.environ.update({k: v for k, v in ros_env(args.domain_id).items() if k.startswith(("ROS_", "FASTDDS_"))})
    rclpy.init()
    sim = None
    try:
        sim = SimRobot(cli_args=["--ros-args", "--params-file", files[2]], parameter_overrides=[
            Parameter("episodes", value=0), Parameter("max_steps", value=int(RATE_HZ * args.duration) + 300),
            Parameter("seed", value=args.seed)])
        return episode(sim, node, args.duration, args.ready_timeout)
    finally:
        if sim is not None:
            sim.destroy_node()
        rclpy.try_shutdown()
        node.terminate()
        node.wait(60)


def episode(sim, node: subprocess.Popen, duration: float, ready_timeout: float) -> dict:
    """Spin the robot until its first episode has run ``duration`` s; sample the node's latencies on the way."""
    import rclpy

    deadline = time.monotonic() + ready_timeout
    while sim._phase != "running":                     # the robot starts its episode once the node reports
        if node.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the node did not get ready (exit code {node.poll()})")
        rclpy.spin_once(sim, timeout_sec=0.05)
    started_wall, started = time.time(), time.monotonic()
    first = last = None
    latencies, received = [], None
    while time.monotonic() - started < duration:
        rclpy.spin_once(sim, timeout_sec=0.2)      # returns at each /diagnostics; idle wakes cost the node CPU
        values = sim._policy
        if not values or node.poll() is not None:
            continue
        now = counters(values)
        if first is None and now.get("control_ticks") is not None:
            first = now
        last, p = now, values
        if now.get("chunks_received") != received and values.get("chunk_latency_ms", "n/a") != "n/a":
            received = now.get("chunks_received")
            latencies.append(float(values["chunk_latency_ms"]) / 1e3)
    if first is None or last is None:
        raise RuntimeError("no /diagnostics from the node during the episode")
    return {"counters": {k: last[k] - first.get(k, 0) for k in last}, "latencies_s": latencies,
            "node_p50_ms": float(p.get("total_latency_p50_ms", "nan")),
            "node_p95_ms": float(p.get("total_latency_p95_ms", "nan")), "started_wall": started_wall}


def holds_by_reason(log: Path, since: float) -> dict[str, int]:
    """Count the node's 'holding: REASON' log lines after ``since`` (wall seconds), by reason."""
    reasons = Counter()
    for line in log.read_text(errors="replace").splitlines():
        match = LOG_LINE.search(line)
        if match and float(match.group(1)) >= since and match.group(2).startswith("holding: "):
            reasons[re.sub(r"\d+(\.\d+)?", "N", match.group(2).removeprefix("holding: "))[:120]] += 1
    return dict(reasons)


def real_time_verdict(log: Path, since: float) -> str:
    """Return the node's last real-time warning after ``since`` (wall seconds; ``control.real_time``), or 'ok'."""
    last = "ok (no warning logged)"
    for line in log.read_text(errors="replace").splitlines():
        match = LOG_LINE.search(line)
        if match and float(match.group(1)) >= since and REAL_TIME_WARNING.search(match.group(2)):
            last = match.group(2)
    return last


def scheduler_column(seconds: list[float], threshold: float, duration: float, from_latency: bool) -> dict:
    """Figures of the scheduler fed these chunk latencies on a simulated clock, refilling as the node did."""
    sim = simulate(seconds, RATE_HZ, HORIZON, threshold, duration, refill_from_latency=from_latency)
    return {"starved_ticks": sim["starved_ticks"], "waiting_ticks": sim["waiting_ticks"], "ticks": sim["ticks"],
            "chunks_received": sim["chunks_received"], "p50_ms": 1e3 * float(np.median(seconds)),
            "p95_ms": 1e3 * float(np.percentile(seconds, 95)),
            "threshold_needed": refill_threshold_for(float(np.percentile(seconds, 95)), RATE_HZ, HORIZON)}


def main(argv: list[str] | None = None) -> int:
    """Run the closed loop, print and optionally save its figures."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.closed_loop", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="smolvla", choices=["smolvla", "tiny"],
                   help="vla-policy-bench's random checkpoint (tiny: for tests of the benchmark itself)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "int8"])
    p.add_argument("--compile", action="store_true", help="the node's compile parameter")
    p.add_argument("--no-trace", action="store_true", help="the node's trace parameter off (eager in Python)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--duration", type=float, default=60.0, help="s of the episode measured")
    p.add_argument("--refill-threshold", type=float, default=1.0,
                   help="chunking.refill_threshold (1.0: request as soon as a chunk arrives)")
    p.add_argument("--refill-from-latency", action=argparse.BooleanOptionalAction, default=True,
                   help="chunking.refill_from_latency (the node's default: on)")
    p.add_argument("--blend", default="latest", help="chunking.blend")
    p.add_argument("--max-observation-age", type=float, default=10.0,
                   help="s; chunks arriving later than this after their observation are refused (hold: policy stale)")
    p.add_argument("--lerobot-json", type=Path, help="a vla-policy-bench smolvla --json result with LeRobot's times")
    p.add_argument("--domain-id", type=int, default=int(os.environ.get("ROS_DOMAIN_ID", "97")))
    p.add_argument("--ready-timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=100)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vla-closed-loop-") as tmp:
        work = Path(tmp)
        checkpoint = checkpoints.save_random_checkpoint(work / "checkpoint", args.config, 1, 0, "float32", {})
        node_overrides(work / "overrides.yaml", checkpoint, args)
        files = [str(package_config(n)) for n in ("default.yaml", "so101.yaml", "demo.yaml")]
        files.append(str(work / "overrides.yaml"))
        result = drive(files, args, work / "node.log")
        result["holds_by_reason"] = holds_by_reason(work / "node.log", result["started_wall"])
        result["real_time"] = real_time_verdict(work / "node.log", result.pop("started_wall"))
    lat = result["latencies_s"]
    result["chunk_p50_ms"] = 1e3 * float(np.median(lat)) if lat else None
    result["chunk_p95_ms"] = 1e3 * float(np.percentile(lat, 95)) if lat else None
    result["config"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    if lat:
        result["ours_scheduler_simulation"] = scheduler_column(lat, args.refill_threshold, args.duration,
                                                               args.refill_from_latency)
    if args.lerobot_json:
        seconds = json.loads(args.lerobot_json.read_text())["lerobot"]["seconds"]
        result["lerobot_scheduler_simulation"] = scheduler_column(seconds, args.refill_threshold, args.duration,
                                                                  args.refill_from_latency)
    publish(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
