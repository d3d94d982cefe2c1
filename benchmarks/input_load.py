# SPDX-License-Identifier: Apache-2.0
"""
CPU cost of high-rate inputs to the installed node: 1 kHz joint states and two 120 Hz cameras.

The node (config/default.yaml, the tiny model, one torch thread) runs as a subprocess on its
own ROS domain, loopback only, frames over the shared-memory profile. A probe publishes joint
states and full-size (640x480 rgb8) frames from threads at a low rate (50 Hz, 15 Hz: the
baseline) and then at the high rate, for ``--seconds`` each. The node's CPU time comes from
/proc; the cost of the inputs is the difference between the two runs, in percent of one core.
The node keeps commanding throughout (commands per second are reported; the tracking check is
off: the probe's joints stand still).

Run: ``python -m benchmarks.input_load [--seconds 10]``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
import subprocess
import threading
import time

import numpy as np
import yaml

from vla_policy_node.ament_registration import installed_executable
from vla_policy_node.bench.dds import DOMAIN_ID, ros_env

CONFIG = Path(__file__).resolve().parents[1] / 'config' / 'default.yaml'


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc/<pid>/stat."""
    with open(f'/proc/{pid}/stat') as stat:
        fields = stat.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


class Publisher:
    """Joint states and camera frames from threads at fixed rates; counts what it sent."""

    def __init__(self, node, parameters: dict) -> None:
        from rclpy.qos import qos_profile_sensor_data
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import String

        from vla_policy_node.ros.conversions import rgb_to_image
        from vla_policy_node.ros.qos import INSTRUCTION_QOS, JOINT_STATES_QOS
        self.node = node
        self.joints = parameters['joint_names']
        self._joint_pub = node.create_publisher(JointState, '/joint_states', JOINT_STATES_QOS)
        self._cameras = [node.create_publisher(Image, topic, qos_profile_sensor_data)
                         for topic in parameters['camera_topics']]
        self._frame = rgb_to_image(np.full((480, 640, 3), 90, np.uint8))
        self._joint_msg = JointState(name=list(self.joints), position=[0.0] * len(self.joints))
        node.create_publisher(String, 'instruction', INSTRUCTION_QOS).publish(String(data='wave'))
        self.sent = {'joint_states': 0, 'frames': 0}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, joint_hz: float, camera_hz: float) -> None:
        self.sent = {'joint_states': 0, 'frames': 0}
        self._stop.clear()
        self._threads = [threading.Thread(target=self._run, args=(joint_hz, self._joints), daemon=True),
                         threading.Thread(target=self._run, args=(camera_hz, self._frames), daemon=True)]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(2.0)

    def _run(self, hz: float, send) -> None:
        period, slot = 1.0 / hz, time.perf_counter()
        while not self._stop.is_set():
            send()
            slot += period
            delay = slot - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            elif delay < -0.1:      # late: catch up in a burst, but never by more than 100 ms
                slot = time.perf_counter() - 0.1

    def _stamp(self, msg) -> None:
        msg.header.stamp = self.node.get_clock().now().to_msg()

    def _joints(self) -> None:
        self._stamp(self._joint_msg)
        self._joint_pub.publish(self._joint_msg)
        self.sent['joint_states'] += 1

    def _frames(self) -> None:
        self._stamp(self._frame)
        for publisher in self._cameras:
            publisher.publish(self._frame)
        self.sent['frames'] += len(self._cameras)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument('--seconds', type=float, default=10.0, help='seconds per load level')
    parser.add_argument('--joint-hz', type=float, default=1000.0, help='joint-state rate of the high load')
    parser.add_argument('--camera-hz', type=float, default=120.0, help='rate of each camera at the high load')
    parser.add_argument('--domain-id', type=int, default=DOMAIN_ID, help='ROS_DOMAIN_ID of the node and the probe')
    args = parser.parse_args(argv)
    env = ros_env(args.domain_id)
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in env.items() if k.startswith(('ROS_', 'FASTDDS_'))})
    try:
        return measure(args, env)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def measure(args: argparse.Namespace, env: dict[str, str]) -> int:
    """Run the node and the probe at both load levels; print the table."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from trajectory_msgs.msg import JointTrajectory

    from vla_policy_node.ros.qos import COMMAND_QOS
    parameters = yaml.safe_load(CONFIG.read_text())['/**']['ros__parameters']
    node_exe = installed_executable()
    # The probe's joints stand still while random weights command motion: the tracking check
    # would latch a protective stop and the node would hold, not command, while measured.
    no_tracking_check = [0.0] * len(parameters['joint_names'])
    process = subprocess.Popen(
        [str(node_exe), '--ros-args', '--params-file', str(CONFIG), '-p', 'allow_random_weights:=true',
         '-p', 'num_threads:=1', '-p', f'limits.max_tracking_error:={no_tracking_check}'],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rclpy.init()
    probe = rclpy.create_node('vla_input_load_probe')
    commands = [0]
    probe.create_subscription(JointTrajectory, parameters['command_topic'],
                              lambda _: commands.__setitem__(0, commands[0] + 1), COMMAND_QOS)
    executor = SingleThreadedExecutor()
    executor.add_node(probe)
    threading.Thread(target=executor.spin, daemon=True).start()
    publisher = Publisher(probe, parameters)
    rows = []
    try:
        publisher.start(50.0, 15.0)
        deadline = time.monotonic() + 120.0
        while commands[0] < 20 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
        publisher.stop()
        if commands[0] < 20:
            output = process.stdout.read() if process.poll() is not None else '(still running)'
            print(f'the node never commanded; its output:\n{output}')
            return 1
        for joint_hz, camera_hz in ((50.0, 15.0), (args.joint_hz, args.camera_hz)):
            publisher.start(joint_hz, camera_hz)
            time.sleep(1.0)
            cpu0, wall0, commands0 = cpu_seconds(process.pid), time.monotonic(), commands[0]
            sent0 = dict(publisher.sent)
            time.sleep(args.seconds)
            cpu, wall = cpu_seconds(process.pid) - cpu0, time.monotonic() - wall0
            sent = {key: (publisher.sent[key] - sent0[key]) / wall for key in sent0}
            publisher.stop()
            rows.append((joint_hz, camera_hz, sent, 100.0 * cpu / wall, (commands[0] - commands0) / wall))
    finally:
        process.terminate()
        try:
            process.wait(10.0)
        except subprocess.TimeoutExpired:
            process.kill()
        executor.shutdown()
        rclpy.try_shutdown()
    print('| joint states asked / sent Hz | frames asked / sent per s | node CPU % of a core | commands/s |')
    print('|---|---|---|---|')
    for joint_hz, camera_hz, sent, cpu, rate in rows:
        print(f"| {joint_hz:.0f} / {sent['joint_states']:.0f} | {2 * camera_hz:.0f} / {sent['frames']:.0f} "
              f'| {cpu:.1f} | {rate:.1f} |')
    print(f'cost of the high-rate inputs over the baseline: {rows[1][3] - rows[0][3]:.1f} % of a core')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
