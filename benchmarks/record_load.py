# SPDX-License-Identifier: Apache-2.0
"""
What vla-policy-record sustains beside the running node: messages/s, MB/s, frames dropped at what load.

For each load (``--loads CAMERAS@FPS,...``; joint states at 200 Hz throughout), on a ROS domain
of its own with frames over shared memory: the installed node (config/default.yaml, the tiny
model, one torch thread, namespace /arm) is given a task, reads the cameras and commands, vla-policy-record
records, and ``benchmarks.camera_load`` publishes for ``--seconds``. Reported per load: what was
sent, written, dropped by the recorder and lost before it, the bag's MB/s and messages/s over
the publishing time, both processes' CPU (percent of one core) and the load average.

Run: ``python -m benchmarks.record_load [--seconds 10] [--loads 2@30,2@60,2@120] [--no-node]``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks.input_load import cpu_seconds
from vla_policy_node.ament_registration import installed_executable
from vla_policy_node.bench.dds import DOMAIN_ID, ros_env

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / 'config' / 'default.yaml'
SHM = {'FASTDDS_DEFAULT_PROFILES_FILE': str(ROOT / 'config' / 'fastdds_shm.xml')}


def start(args: list[str], folder: Path, name: str) -> subprocess.Popen:
    """Start a process on the benchmark's domain, its output in ``folder/name.log``."""
    log = open(folder / f'{name}.log', 'w')
    return subprocess.Popen(args, env={**ros_env(DOMAIN_ID), **SHM}, stdout=log, stderr=subprocess.STDOUT,
                            cwd=folder if name == 'recorder' else ROOT)


def wait_for(path: Path, text: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while text not in path.read_text():
        if time.monotonic() > end:
            raise SystemExit(f'no {text!r} in {path}:\n{path.read_text()}')
        time.sleep(0.1)


def run(cameras: int, fps: float, seconds: float, node: bool, folder: Path) -> dict:
    """One load: node (optional), recorder and publisher; return the figures."""
    measured = {}
    if node:
        measured['node'] = start([str(installed_executable('vla_policy_node')), '--ros-args', '--params-file',
                                  str(CONFIG), '-p', 'allow_random_weights:=true', '-p', 'num_threads:=1',
                                  '-r', '__ns:=/arm'], folder, 'node')
        wait_for(folder / 'node.log', 'ready:', 120.0)
    measured['recorder'] = start([sys.executable, '-m', 'vla_policy_node.replay.record', 'bag', '--params-file',
                                  str(CONFIG), '--ros-args', '-r', '__ns:=/arm'], folder, 'recorder')
    wait_for(folder / 'recorder.log', 'recording [', 60.0)
    publisher = start([sys.executable, '-m', 'benchmarks.camera_load', '--seconds', str(seconds), '--cameras',
                       str(cameras), '--fps', str(fps), '--instruction', 'pick up the cube',
                       '--subscribers', '2' if node else '1'], folder, 'publisher')
    wait_for(folder / 'publisher.log', 'waiting', 60.0)
    before, began = {name: cpu_seconds(p.pid) for name, p in measured.items()}, time.monotonic()
    wait_for(folder / 'publisher.log', 'sent ', 60.0 + seconds * 3)      # publishing is over
    elapsed = time.monotonic() - began
    cpu = {name: 100 * (cpu_seconds(p.pid) - before[name]) / elapsed for name, p in measured.items()}
    load = os.getloadavg()[0]
    publisher.wait(30.0)
    time.sleep(1.0)
    for process in [measured['recorder']] + ([measured['node']] if node else []):
        process.send_signal(signal.SIGINT)
        process.wait(60.0)
    summary = [line.split() for line in (folder / 'recorder.log').read_text().splitlines() if line.startswith('  /')]
    sent = sum(int(line.split()[2]) for line in (folder / 'publisher.log').read_text().splitlines()
               if line.startswith('sent ') and '/camera/' in line)
    frames = [row for row in summary if '/camera/' in row[0]]
    return {'load': load, 'cpu': cpu, 'sent': sent, 'elapsed': elapsed,
            'size': sum(path.stat().st_size for path in (folder / 'bag').iterdir()),
            'messages': sum(int(row[3]) for row in summary),
            'frames': [sum(int(row[i]) for row in frames) for i in (3, 5, 7)]}     # written, dropped, lost


def main() -> None:
    """Run each load and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.strip().split('\n\n')[0])
    parser.add_argument('--seconds', type=float, default=10.0)
    parser.add_argument('--loads', default='2@30,2@60,2@120',
                        help="CAMERAS@FPS, comma-separated (the config's two cameras are recorded)")
    parser.add_argument('--no-node', action='store_true', help='the recorder and the publisher only')
    parser.add_argument('--logs', type=Path, help="keep each load's recorder and publisher output here")
    args = parser.parse_args()
    print(f"{'load':>8} {'node':>5} {'msg/s':>7} {'MB/s':>6} {'frames sent':>11} {'written':>8} {'dropped':>8} "
          f"{'lost':>5} {'recorder CPU':>12} {'node CPU':>8} {'loadavg':>7}")
    for load in args.loads.split(','):
        cameras, fps = load.split('@')
        with tempfile.TemporaryDirectory(prefix='record_load_') as folder:
            figures = run(int(cameras), float(fps), args.seconds, not args.no_node, Path(folder))
            if args.logs:
                args.logs.mkdir(parents=True, exist_ok=True)
                for log in Path(folder).glob('*.log'):
                    shutil.copy(log, args.logs / f'{load}_{log.name}')
        written, dropped, lost = figures['frames']
        cpu = figures['cpu']
        print(f"{load:>8} {'no' if args.no_node else 'yes':>5} {figures['messages'] / args.seconds:>7.0f} "
              f"{figures['size'] / 1e6 / args.seconds:>6.1f} {figures['sent']:>11} {written:>8} {dropped:>8} "
              f"{lost:>5} {cpu['recorder']:>11.0f}% {cpu.get('node', 0.0):>7.0f}% {figures['load']:>7.2f}", flush=True)


if __name__ == '__main__':
    main()
