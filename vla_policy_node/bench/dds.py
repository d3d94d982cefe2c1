# SPDX-License-Identifier: Apache-2.0
"""
``vla-policy-bench --dds``: the installed node over DDS on localhost, frame published -> command received.

The node runs as a subprocess on the bench's checkpoint (its own ROS_DOMAIN_ID,
discovery limited to localhost) at ``--control-rate`` Hz (a new chunk's first
command waits for the next tick: half a period on average). A probe node keeps the joint states fresh and sends
the instruction; each iteration it lets the camera go stale (the node drops
its plan and holds, publishing nothing more), then streams one frame at 30 Hz
and times the first command from the first publication: that command comes
from a chunk computed on this frame. The ROS overhead is that latency minus the node's own
observation-to-chunk time (its ``total_latency_p50_ms`` diagnostic).

rclpy is imported here only, and only when this mode runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from vla_policy_node.ament_registration import installed_executable

DOMAIN_ID = int(os.environ.get("VLA_BENCH_DOMAIN_ID", "97"))      # 80-99 are the project's test domains
STALE_AFTER = 0.2            # s: the node's max_observation_age here
CAMERA_HZ = 30.0
JOINTS = [f"joint{i}" for i in range(6)]


def shm_profile() -> Path:
    """Locate ``config/fastdds_shm.xml`` (source tree, else the installed share folder)."""
    source = Path(__file__).resolve().parents[2] / "config" / "fastdds_shm.xml"
    if source.is_file():
        return source
    from ament_index_python.packages import get_package_share_directory
    return Path(get_package_share_directory("vla_policy_node")) / "config" / "fastdds_shm.xml"


def ros_env(domain_id: int = DOMAIN_ID) -> dict[str, str]:
    """
    Return the environment of the bench's DDS processes: loopback only, shared memory for frames.

    Full-size camera frames do not fit Fast DDS's default 512 KiB shared-memory segment and
    are lost as best-effort UDP fragments; the project's profile carries them (see README).
    """
    return {**os.environ, "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "ROS_LOCALHOST_ONLY": "1",
            "ROS_DOMAIN_ID": str(domain_id), "PYTHONUNBUFFERED": "1",
            "FASTDDS_DEFAULT_PROFILES_FILE": str(shm_profile())}


def write_params(path: Path, checkpoint: Path, camera_names: list[str], dtype: str, threads: int,
                 rate_hz: float, compile_policy: bool = False) -> None:
    params = {"/**": {"ros__parameters": {
        "checkpoint": str(checkpoint), "device": "cpu", "dtype": dtype, "num_threads": threads,
        "compile": compile_policy,
        "camera_topics": [f"bench/{c}/image_raw" for c in camera_names], "camera_names": camera_names,
        "joint_names": JOINTS, "instruction_topic": "bench/instruction", "joint_states_topic": "bench/joint_states",
        "command_interface": "forward_command", "command_topic": "bench/commands",
        "control_rate_hz": rate_hz, "max_observation_age": STALE_AFTER, "diagnostics_period": 0.5,
        # The bench's joints stand still whatever is commanded: no tracking check.
        "limits": {"lower": [-10.0] * 6, "upper": [10.0] * 6, "max_velocity": [1e3] * 6, "max_step": 10.0,
                   "max_tracking_error": [0.0]},
    }}}
    path.write_text(json.dumps(params))      # YAML is a superset of JSON


class Probe:
    """The bench's ROS side: joint states, the instruction, camera frames out; commands and diagnostics in."""

    def __init__(self, camera_names: list[str]) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import Float64MultiArray, String

        from vla_policy_node.ros.qos import (CAMERA_QOS, COMMAND_QOS, DIAGNOSTICS_QOS, INSTRUCTION_QOS,
                                             JOINT_STATES_QOS)

        rclpy.init()
        self.node = probe = rclpy.create_node("vla_bench_probe")
        self.commands = threading.Event()
        self.received = 0.0
        self.total_p50_ms = None
        probe.create_subscription(Float64MultiArray, "bench/commands", self._on_command, COMMAND_QOS)
        probe.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, DIAGNOSTICS_QOS)
        self.cams = [probe.create_publisher(Image, f"bench/{c.split('.')[-1]}/image_raw", CAMERA_QOS)
                     for c in camera_names]
        joints = probe.create_publisher(JointState, "bench/joint_states", JOINT_STATES_QOS)
        instruction = probe.create_publisher(String, "bench/instruction", INSTRUCTION_QOS)
        instruction.publish(String(data="pick up the red cube and put it in the bin"))
        probe.create_timer(0.02, lambda: joints.publish(JointState(name=JOINTS, position=[0.0] * 6)))
        self.executor = SingleThreadedExecutor()
        self.executor.add_node(probe)
        threading.Thread(target=self.executor.spin, daemon=True).start()

    def _on_command(self, _msg) -> None:
        self.received = time.perf_counter()
        self.commands.set()

    def _on_diagnostics(self, msg) -> None:
        for status in msg.status:
            for kv in status.values:
                if kv.key == "total_latency_p50_ms":
                    self.total_p50_ms = float(kv.value)

    def publish_frame(self, frame) -> None:
        """Publish one frame on every camera topic."""
        for pub in self.cams:
            pub.publish(frame)

    def close(self) -> None:
        """Stop spinning and shut the probe's context down."""
        import rclpy

        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.try_shutdown()


def wait_ready(probe: Probe, proc: subprocess.Popen, log, log_path: Path, timeout: float = 600.0) -> None:
    """Wait until the node reports its latencies (loaded and warmed up); raise if it exits first."""
    deadline = time.monotonic() + timeout
    while probe.total_p50_ms is None and time.monotonic() < deadline:
        if proc.poll() is not None:
            log.flush()
            raise RuntimeError(f"the node exited (code {proc.returncode}):\n" + log_path.read_text()[-4000:])
        time.sleep(0.1)


def time_frames(probe: Probe, frame_hw: tuple[int, int], iters: int, warmup: int, progress) -> tuple[list, int]:
    """Time frame -> first command ``warmup + iters`` times; return the timed latencies and the frames lost."""
    from sensor_msgs.msg import Image

    h, w = frame_hw
    rng = np.random.default_rng(0)
    latencies: list[float] = []
    lost = 0
    settle = 0.3
    for i in range(warmup + iters):
        # The node re-plans while the frame is fresh; once it is stale (plan dropped, one hold,
        # then silence) the last inference must have ended, or the next frame would wait for it.
        time.sleep(STALE_AFTER + settle)
        probe.commands.clear()
        frame = Image(height=h, width=w, encoding="rgb8", step=3 * w,
                      data=rng.integers(0, 256, h * w * 3, dtype=np.uint8).tobytes())
        sent = time.perf_counter()
        while True:                  # a 30 Hz camera: a frame lost on the best-effort topic costs a period
            probe.publish_frame(frame)
            if probe.commands.wait(timeout=1 / CAMERA_HZ) or time.perf_counter() - sent > 60:
                break
            lost += 1
        if not probe.commands.is_set():
            continue
        settle = max(0.3, 3 * (probe.received - sent))
        if i >= warmup:
            latencies.append(probe.received - sent)
            progress(f"dds {i + 1 - warmup}/{iters}: frame -> command {1e3 * latencies[-1]:.1f} ms")
    return latencies, lost


def measure(checkpoint: Path, camera_names: list[str], frame_hw: tuple[int, int], dtype: str, threads: int,
            rate_hz: float, iters: int, warmup: int, progress, compile_policy: bool = False) -> dict:
    """Frame-to-command latency of the installed node (seconds summarized by the caller)."""
    os.environ.update({k: v for k, v in ros_env().items() if k.startswith(("ROS_", "FASTDDS_"))})
    try:
        node_exe = installed_executable()
    except FileNotFoundError as missing:
        return {"available": False, "reason": str(missing)}
    work = Path(tempfile.mkdtemp(prefix="vla-bench-dds-"))
    params = work / "params.yaml"
    write_params(params, checkpoint, [c.split(".")[-1] for c in camera_names], dtype, threads, rate_hz,
                 compile_policy)
    probe = Probe(camera_names)                     # rclpy imported (and any import error raised) first
    log = open(work / "node.log", "w")
    try:
        proc = subprocess.Popen([str(node_exe), "--ros-args", "--params-file", str(params)], env=ros_env(),
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(probe, proc, log, work / "node.log")
            latencies, lost = time_frames(probe, frame_hw, iters, warmup, progress)
            time.sleep(1.2)                         # one more diagnostics period
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        probe.close()
        log.close()
        shutil.rmtree(work, ignore_errors=True)      # nothing left in the temp folder
    return {"available": True, "domain_id": DOMAIN_ID, "control_rate_hz": rate_hz, "compile": compile_policy,
            "frames_without_command_within_a_period": lost,
            "latencies_s": latencies, "node_total_p50_ms": probe.total_p50_ms}
