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
        "limits": {"lower": [-10.0] * 6, "upper": [10.0] * 6, "max_velocity": [1e3] * 6, "max_step": 10.0},
    }}}
    path.write_text(json.dumps(params))      # YAML is a superset of JSON


def measure(checkpoint: Path, camera_names: list[str], frame_hw: tuple[int, int], dtype: str, threads: int,
            rate_hz: float, iters: int, warmup: int, progress, compile_policy: bool = False) -> dict:
    """Frame-to-command latency of the installed node (seconds summarized by the caller)."""
    os.environ.update({k: v for k, v in ros_env().items() if k.startswith(("ROS_", "FASTDDS_"))})
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import Float64MultiArray, String

    from vla_policy_node.ros.qos import CAMERA_QOS, COMMAND_QOS, DIAGNOSTICS_QOS, INSTRUCTION_QOS, JOINT_STATES_QOS

    try:
        node_exe = installed_executable()
    except FileNotFoundError as missing:
        return {"available": False, "reason": str(missing)}
    work = Path(tempfile.mkdtemp(prefix="vla-bench-dds-"))
    params = work / "params.yaml"
    write_params(params, checkpoint, [c.split(".")[-1] for c in camera_names], dtype, threads, rate_hz,
                 compile_policy)
    log = open(work / "node.log", "w")
    proc = subprocess.Popen([str(node_exe), "--ros-args", "--params-file", str(params)], env=ros_env(),
                            stdout=log, stderr=subprocess.STDOUT)
    rclpy.init()
    probe = rclpy.create_node("vla_bench_probe")
    commands = threading.Event()
    state = {"received": 0.0, "total_p50_ms": None}

    def on_command(_msg) -> None:
        state["received"] = time.perf_counter()
        commands.set()

    def on_diagnostics(msg) -> None:
        for status in msg.status:
            for kv in status.values:
                if kv.key == "total_latency_p50_ms":
                    state["total_p50_ms"] = float(kv.value)

    probe.create_subscription(Float64MultiArray, "bench/commands", on_command, COMMAND_QOS)
    probe.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, DIAGNOSTICS_QOS)
    cams = [probe.create_publisher(Image, f"bench/{c.split('.')[-1]}/image_raw", CAMERA_QOS) for c in camera_names]
    joints = probe.create_publisher(JointState, "bench/joint_states", JOINT_STATES_QOS)
    instruction = probe.create_publisher(String, "bench/instruction", INSTRUCTION_QOS)
    instruction.publish(String(data="pick up the red cube and put it in the bin"))
    probe.create_timer(0.02, lambda: joints.publish(JointState(name=JOINTS, position=[0.0] * 6)))
    executor = SingleThreadedExecutor()
    executor.add_node(probe)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()

    h, w = frame_hw
    rng = np.random.default_rng(0)
    latencies: list[float] = []
    lost = 0
    try:
        deadline = time.monotonic() + 600
        while state["total_p50_ms"] is None and time.monotonic() < deadline:      # loaded and warmed up
            if proc.poll() is not None:
                log.flush()
                raise RuntimeError(f"the node exited (code {proc.returncode}):\n"
                                   + (work / "node.log").read_text()[-4000:])
            time.sleep(0.1)
        settle = 0.3
        for i in range(warmup + iters):
            # The node re-plans while the frame is fresh; once it is stale (plan dropped, one hold,
            # then silence) the last inference must have ended, or the next frame would wait for it.
            time.sleep(STALE_AFTER + settle)
            commands.clear()
            frame = Image(height=h, width=w, encoding="rgb8", step=3 * w,
                          data=rng.integers(0, 256, h * w * 3, dtype=np.uint8).tobytes())
            sent = time.perf_counter()
            while True:                  # a 30 Hz camera: a frame lost on the best-effort topic costs a period
                for pub in cams:
                    pub.publish(frame)
                if commands.wait(timeout=1 / CAMERA_HZ) or time.perf_counter() - sent > 60:
                    break
                lost += 1
            if not commands.is_set():
                continue
            settle = max(0.3, 3 * (state["received"] - sent))
            if i >= warmup:
                latencies.append(state["received"] - sent)
                progress(f"dds {i + 1 - warmup}/{iters}: frame -> command {1e3 * latencies[-1]:.1f} ms")
        time.sleep(1.2)                             # one more diagnostics period
    finally:
        executor.shutdown()
        probe.destroy_node()
        rclpy.try_shutdown()
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        shutil.rmtree(work, ignore_errors=True)          # nothing left in the temp folder
    return {"available": True, "domain_id": DOMAIN_ID, "control_rate_hz": rate_hz, "compile": compile_policy,
            "frames_without_command_within_a_period": lost,
            "latencies_s": latencies, "node_total_p50_ms": state["total_p50_ms"]}
