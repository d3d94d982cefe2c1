# SPDX-License-Identifier: Apache-2.0
"""
``python -m benchmarks.remote``: one vla_policy_server for N robots against N local nodes.

Served: the real ``vla_policy_server`` runs as a subprocess (tiny model, ``--threads`` torch
threads, its own ROS_DOMAIN_ID, localhost only); this process plays N robots with the real
wire format: each sends a request (two ``--frame`` camera frames, state, its own
instruction), and sends the next one the moment its answer arrives (closed loop, saturated:
the server's capacity, not a control rate). Measured per N: chunks/s over all robots,
request-to-chunk latency p50/p95 (publish -> answer decoded), batch sizes the server reached.

Local: N processes, each one robot's own node's inference (the same tiny model, the same
observation, back to back, ``--threads`` each), started together on the same machine: chunks/s
and observation-to-chunk latency. They skip DDS entirely and, with N > 1, use more than the
server's cores: both favour them.

``--batch-cost CONFIG`` instead times ``Policy.predict_action_chunks`` in this process for
each batch size (``tiny`` or ``smolvla``, random weights at real size): the per-batch cost
from which a GPU's capacity is estimated. With ``--built``, the warm-up first builds what a
server builds (CUDA graphs on CUDA, compiled programs on the CPU, for batch sizes 1, 2, 4,
... up to the largest asked), and each size is timed both ways, eager and built chunks
alternating, with the paired ratio.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

TASKS = ('pick up the red cube', 'open the top drawer', 'stack the green block on the blue one',
         'push the cup to the left', 'wipe the table', 'close the laptop', 'fold the towel',
         'put the pen in the mug')
JOINTS = [f'joint{i}' for i in range(6)]
CAMERAS = ['front', 'wrist']


def observation(frame: tuple[int, int], index: int) -> dict:
    """Return robot ``index``'s observation: its own frames, state and instruction."""
    rng = np.random.default_rng(index)
    return {'images': {name: rng.integers(0, 256, (*frame, 3), dtype=np.uint8) for name in CAMERAS},
            'state': rng.normal(size=6).astype(np.float32), 'task': TASKS[index % len(TASKS)]}


def percentiles(samples: list[float]) -> dict:
    values = np.array(samples) * 1e3
    return {'p50_ms': float(np.percentile(values, 50)), 'p95_ms': float(np.percentile(values, 95)),
            'count': len(samples)}


# ---------------------------------------------------------------------- served
def serve(robot_counts: list[int], seconds: float, threads: int, frame: tuple[int, int],
          domain_id: int, window: float) -> list[dict]:
    """Run the server once and N closed-loop robots against it for each N."""
    env = {**os.environ, 'ROS_AUTOMATIC_DISCOVERY_RANGE': 'LOCALHOST', 'ROS_LOCALHOST_ONLY': '1',
           'ROS_DOMAIN_ID': str(domain_id), 'PYTHONUNBUFFERED': '1'}
    os.environ.update({k: v for k, v in env.items() if k.startswith('ROS_')})
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    from vla_policy_node.ros.qos import REMOTE_FLEET_QOS
    from vla_policy_node.ros.server.protocol import ANSWER_TYPE, decode_chunk, encode_request, REQUEST_TYPE, RequestKey

    work = Path(tempfile.mkdtemp(prefix='vla-bench-remote-'))
    params = work / 'server.yaml'
    params.write_text(json.dumps({'/**': {'ros__parameters': {
        'allow_random_weights': True, 'device': 'cpu', 'num_threads': threads,
        'camera_names': CAMERAS, 'joint_names': JOINTS, 'batch.window': window,
        'tiny_model.chunk_size': 50, 'tiny_model.num_steps': 10}}}))
    log = open(work / 'server.log', 'w')
    server = subprocess.Popen(
        [sys.executable, '-c', 'from vla_policy_node.ros.entry import server_main; '
         'raise SystemExit(server_main())', '--ros-args', '--params-file', str(params)],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    rclpy.init()
    node = rclpy.create_node('vla_bench_robots')
    lock = threading.Lock()
    state = {'robots': 0, 'sent': {}, 'latencies': [], 'batch_sizes': [], 'chunks': 0}
    observations = [observation(frame, i) for i in range(max(robot_counts))]
    # One publisher per robot, as each robot node has: the server queues one request per publisher.
    requests = [node.create_publisher(REQUEST_TYPE, '/vla_policy_server/requests', REMOTE_FLEET_QOS)
                for _ in range(max(robot_counts))]

    def send(robot: int, request_id: int) -> None:
        msg = encode_request(RequestKey(f'/robot{robot}', 'bench', request_id, 0, 0.0), JOINTS, observations[robot],
                             None, horizon=50)
        with lock:
            state['sent'][robot] = (request_id, time.perf_counter())
        requests[robot].publish(msg)

    def on_answer(msg) -> None:
        answer = decode_chunk(msg)
        arrived = time.perf_counter()
        robot = int(answer.request.reply_to.key.robot[len('/robot'):])
        with lock:
            request_id, sent = state['sent'].get(robot, (None, 0.0))
            if request_id != answer.request.reply_to.key.request_id or robot >= state['robots']:
                return
            if answer.fault is None:
                state['latencies'].append(arrived - sent)
                state['batch_sizes'].append(answer.batch_size)
                state['chunks'] += 1
        send(robot, request_id + 1)

    node.create_subscription(ANSWER_TYPE, '/vla_policy_server/chunks', on_answer, REMOTE_FLEET_QOS)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    threading.Thread(target=executor.spin, daemon=True).start()
    rows = []
    try:
        end = time.monotonic() + 300
        while 'ready:' not in (work / 'server.log').read_text():
            if server.poll() is not None or time.monotonic() > end:
                log.flush()
                raise RuntimeError('the server did not start:\n' + (work / 'server.log').read_text()[-4000:])
            time.sleep(0.2)
        while not all(r.get_subscription_count() for r in requests) and time.monotonic() < end:
            time.sleep(0.05)
        for count in robot_counts:
            with lock:
                state.update(robots=count, latencies=[], batch_sizes=[], chunks=0, sent={})
            for robot in range(count):
                send(robot, 0)
            time.sleep(1.0)                                   # warm-up: shapes of this batch size
            with lock:
                state.update(latencies=[], batch_sizes=[], chunks=0)
            started = time.perf_counter()
            time.sleep(seconds)
            with lock:
                elapsed = time.perf_counter() - started
                rows.append({'robots': count, 'chunks_per_s': state['chunks'] / elapsed,
                             'latency': percentiles(state['latencies']),
                             'mean_batch': float(np.mean(state['batch_sizes'])),
                             'max_batch': int(max(state['batch_sizes']))})
                state['robots'] = 0                           # answers still in flight are dropped
            time.sleep(1.0)
            print(f'served {count}: {rows[-1]}', file=sys.stderr)
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
        server.terminate()
        server.wait(timeout=30)
        log.close()
        shutil.rmtree(work, ignore_errors=True)          # nothing left in the temp folder
    return rows


# ---------------------------------------------------------------------- local
LOCAL_WORKER = '''
import json, sys, time
import torch
from benchmarks.remote import observation
from vla_policy_node.loading.load import build_tiny_policy
index, threads, seconds, h, w, start = sys.argv[1:7]
torch.set_num_threads(int(threads))
policy = build_tiny_policy(camera_names=("observation.images.front", "observation.images.wrist"),
                           chunk_size=50, num_steps=10)
obs = observation((int(h), int(w)), int(index))
policy.warmup(obs)
while time.time() < float(start):
    time.sleep(0.005)
latencies = []
end = time.perf_counter() + float(seconds)
while time.perf_counter() < end:
    t0 = time.perf_counter()
    policy.predict_action_chunk(obs)
    latencies.append(time.perf_counter() - t0)
print(json.dumps(latencies))
'''


def local(robot_counts: list[int], seconds: float, threads: int, frame: tuple[int, int]) -> list[dict]:
    """Run N independent local policies at once for each N; the cores are shared as they would be."""
    rows = []
    for count in robot_counts:
        per_node = threads
        start = time.time() + 20.0                         # all loaded and warm by then
        workers = [subprocess.Popen(
            [sys.executable, '-c', LOCAL_WORKER, str(i), str(per_node), str(seconds), *map(str, frame),
             str(start)], stdout=subprocess.PIPE, text=True) for i in range(count)]
        latencies = [json.loads(worker.communicate(timeout=600)[0]) for worker in workers]
        flat = [x for run in latencies for x in run]
        rows.append({'robots': count, 'threads_per_node': per_node,
                     'chunks_per_s': sum(len(run) / seconds for run in latencies),
                     'latency': percentiles(flat)})
        print(f'local {count}: {rows[-1]}', file=sys.stderr)
    return rows


# ---------------------------------------------------------------------- per-batch cost
def batch_cost(config: str, sizes: list[int], iters: int, threads: int, device: str = 'cpu',
               dtype: str = 'float32', built: bool = False) -> list[dict]:
    """Time one batched prefix pass + denoising loop per batch size, in this process (and built, paired)."""
    import torch

    from vla_policy_node.loading.load import build_tiny_policy, load_policy
    from vla_policy_node.runtime.engine import EAGER, RuntimeConfig
    from vla_policy_node.runtime.shape_buckets import batch_buckets, smallest_holding

    torch.set_num_threads(threads)
    if config == 'tiny':
        policy = build_tiny_policy(camera_names=tuple(f'observation.images.{c}' for c in CAMERAS),
                                   chunk_size=50, num_steps=10, device=device, dtype=dtype)
    else:
        from vla_policy_node.bench.checkpoints import save_random_checkpoint
        with tempfile.TemporaryDirectory(prefix='vla-bench-batch-') as tmp:   # loaded, then removed
            folder = save_random_checkpoint(Path(tmp) / 'ckpt', config, len(CAMERAS), dtype=dtype)
            policy = load_policy(str(folder), device=device, dtype=dtype)
    runtime = policy.runtime
    flag = 'cuda_graphs' if policy.device.type == 'cuda' else 'torch_compile'
    if built:
        runtime.configure(RuntimeConfig(**{flag: True}, batch_sizes=batch_buckets(max(sizes))))
        t0 = time.perf_counter()
        policy.warmup(policy.dummy_observation(), iterations=1, race_rounds=0)
        print(f'built {len(runtime.compiled_signatures) + len(runtime.graphed_signatures)} shapes '
              f'({flag}) in {time.perf_counter() - t0:.1f} s', file=sys.stderr)
    built_path = runtime.path
    h, w = policy.preprocessor.image_size
    names = [c.split('.')[-1] for c in policy.camera_names]
    rows = []
    for size in sizes:
        batch = []
        for i in range(size):
            obs = observation((h, w), i)
            obs['images'] = {name: obs['images'][CAMERAS[k % 2]] for k, name in enumerate(names)}
            obs['state'] = np.resize(obs['state'], policy.state_dim).astype(np.float32)
            batch.append(obs)
        modes = (False, True) if built else (False,)
        times: dict[bool, list[float]] = {mode: [] for mode in modes}
        for i in range(iters + 1):                   # the first round is untimed
            for mode in modes:
                runtime.path = built_path if mode else EAGER
                t0 = time.perf_counter()
                policy.predict_action_chunks(batch, [None] * size)
                if i:
                    times[mode].append(time.perf_counter() - t0)
        median = float(np.median(times[False]))
        row = {'batch': size, 'device': str(policy.device), 'median_ms': median * 1e3,
               'per_robot_ms': median * 1e3 / size, 'iters': iters}
        if built:
            built_ms = float(np.median(times[True])) * 1e3
            ratio = float(np.median(np.divide(times[False], times[True])))
            row.update({'built_median_ms': built_ms, 'built_per_robot_ms': built_ms / size,
                        'built_bucket': smallest_holding(runtime.batch_sizes, size),
                        'eager_vs_built_paired': ratio})
        rows.append(row)
        print(f'{config} batch {size}: {rows[-1]}', file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument('--robots', type=int, nargs='+', default=[1, 2, 4, 8])
    parser.add_argument('--seconds', type=float, default=8.0)
    parser.add_argument('--threads', type=int, default=1, help='torch threads of the server and of '
                        'each local node (more than 1 thrashes on a loaded machine)')
    parser.add_argument('--frame', type=int, nargs=2, default=[240, 320], metavar=('H', 'W'))
    parser.add_argument('--window', type=float, default=0.0, help='batch.window (s); 0: continuous batching')
    parser.add_argument('--domain-id', type=int, default=int(os.environ.get('ROS_DOMAIN_ID', '97')))
    parser.add_argument('--batch-cost', choices=('tiny', 'smolvla'))
    parser.add_argument('--iters', type=int, default=3)
    parser.add_argument('--device', default='cpu', help='--batch-cost only: cpu, cuda, cuda:N')
    parser.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16'),
                        help='--batch-cost only')
    parser.add_argument('--built', action='store_true', help='--batch-cost only: also time CUDA graphs (CUDA) '
                        'or compiled programs (CPU) built for batch buckets, alternating with eager')
    parser.add_argument('--json', type=Path)
    args = parser.parse_args(argv)
    if args.batch_cost:
        rows = batch_cost(args.batch_cost, args.robots, args.iters, args.threads, args.device,
                          args.dtype, args.built)
        result = {'batch_cost': rows}
    else:
        frame = tuple(args.frame)
        result = {'served': serve(args.robots, args.seconds, args.threads, frame, args.domain_id,
                                  args.window),
                  'local': local(args.robots, args.seconds, args.threads, frame)}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == '__main__':
    sys.exit(main())
