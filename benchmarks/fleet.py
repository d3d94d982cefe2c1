# SPDX-License-Identifier: Apache-2.0
"""
``python -m benchmarks.fleet``: N simulated robots, out of step, against one or two policy servers.

What runs for real: the server's :class:`BatchServer` (continuous batching, or a ``--window``
for comparison), one per server, each on its own thread; the robots' server choice
(``server.pool.rendezvous``); and a robot model of the node's chunk execution: each robot
ticks at its own rate (uniform in ``--rates``) from a random phase, executes one action per
tick, asks for the next chunk when ``--refill`` of its ``--horizon`` actions are left, skips
the actions its round trip took (delay compensation), and refuses an answer older than
``--deadline`` (``max_observation_age``). A tick with no action left is a starved tick (the
node would hold). What stands in: the policy's compute. Each server sleeps the measured time
of a batch of that size (eager: interpolated between the measured sizes; ``--padded``: the
time of the smallest bucket that holds it, as with CUDA graphs), so two servers are two
accelerators, not two threads fighting over this machine's 2 cores. The per-batch costs are
measured first in this process (``--model``, as ``benchmarks.remote --batch-cost``), or read
from ``--costs`` (that command's ``--json``, e.g. taken on a GPU).

Reported per fleet size and configuration: mean batch size and bucket fill, queue wait
(mean, p99), request-to-answer (p50, p99), starved ticks per robot (mean, worst robot),
answers wasted (too old, or to a request its robot gave up at the deadline), chunks served
and chunks used per second. Then the projection: robots one
server can serve from the per-batch costs alone (steady state, every batch taking what
arrived during the previous one, latency within the deadline), to set against the run.
``--svg`` draws p99 request-to-answer and starved ticks against the fleet size.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
import heapq
import json
from pathlib import Path
import sys
import threading
import time

import numpy as np

from vla_policy_node.runtime.shape_buckets import batch_buckets, smallest_holding
from vla_policy_node.server.batching import BatchConfig, BatchServer, ServedChunk, ServedRequest
from vla_policy_node.server.pool import rendezvous

SERVERS = ('/gpu0/vla_policy_server', '/gpu1/vla_policy_server')


class BatchCosts:
    """Seconds per batch of n rows, from a few measured sizes."""

    def __init__(self, measured: dict[int, float], padded: bool) -> None:
        self.sizes = sorted(measured)
        self.seconds = [measured[n] for n in self.sizes]
        self.padded = padded

    def __call__(self, rows: int) -> float:
        """Return the time of a batch of ``rows``: its bucket's, or interpolated (eager)."""
        if self.padded:
            return self.seconds[self.sizes.index(smallest_holding(self.sizes, rows) or self.sizes[-1])]
        return float(np.interp(rows, self.sizes, self.seconds))


class TimedPolicy:
    """Takes the measured time of each batch; answers zeros. Stands in for an accelerator."""

    def __init__(self, costs: BatchCosts, horizon: int) -> None:
        self.costs, self.horizon = costs, horizon
        self.rows: list[int] = []
        self.stats = type('Stats', (), {'prefix_passes': 0})()

    def predict_action_chunks(self, observations: list, rtcs: list) -> np.ndarray:
        """Sleep for one batch of ``len(observations)`` rows."""
        self.rows.append(len(observations))
        self.stats.prefix_passes += 1
        time.sleep(self.costs(len(observations)))
        return np.zeros((len(observations), self.horizon, 6), np.float32)


@dataclass
class Robot:
    """One robot's chunk execution, as the node's scheduler does it, reduced to counts."""

    name: str
    rate: float
    horizon: int
    refill: int
    deadline: float
    left: int = 0                       # actions of the current chunk not yet executed
    request_id: int = 0
    asked_at: float | None = None       # the request in flight was sent then
    started: bool = False               # the first chunk came: starved ticks count from here
    starved: int = 0
    ticks: int = 0
    wasted: int = 0                     # answers too old, or to a request given up at its deadline
    round_trips: list[float] = field(default_factory=list)
    inbox: list[tuple[int, float]] = field(default_factory=list)    # (request id, arrival time)

    def tick(self, now: float, ask: Callable[[Robot], None]) -> None:
        """Take the answer that came, execute one action (or starve), ask when the chunk runs low."""
        for request_id, arrived in self.inbox:
            if self.asked_at is None or request_id != self.request_id:
                self.wasted += 1                            # the answer to a request given up
                continue
            round_trip, self.asked_at = arrived - self.asked_at, None
            if round_trip > self.deadline:
                self.wasted += 1
                continue
            self.round_trips.append(round_trip)
            self.left = max(0, self.horizon - round(round_trip * self.rate))   # skip what the trip took
            self.started = True
        self.inbox.clear()
        if self.asked_at is not None and now - self.asked_at > self.deadline:
            self.asked_at = None                            # the node's deadline: ask again
        if self.started:
            self.ticks += 1
            if self.left > 0:
                self.left -= 1
            else:
                self.starved += 1
        if self.left <= self.refill and self.asked_at is None:
            self.request_id += 1
            self.asked_at = now
            ask(self)


def run_fleet(robots: int, servers: int, costs: BatchCosts, window: float, seconds: float,
              rates: tuple[float, float], horizon: int, refill: float, deadline: float,
              max_batch: int, seed: int) -> dict:
    """Run ``robots`` robots against ``servers`` servers for ``seconds``; return the measures."""
    rng = np.random.default_rng(seed)
    lock = threading.Lock()
    waits: list[float] = []
    served = [0]

    def deliver(answer: ServedChunk) -> None:
        with lock:
            waits.append(answer.queue_wait)
            served[0] += 1
            robot, request_id = answer.request.reply_to
            robot.inbox.append((request_id, time.monotonic()))

    names = SERVERS[:servers]
    policies = {name: TimedPolicy(costs, horizon) for name in names}
    batchers = {name: BatchServer(policies[name], deliver, BatchConfig(window, max_batch, 256)) for name in names}
    for batcher in batchers.values():
        batcher.start()
    fleet = [Robot(f'/robot{i}/vla_policy_node', float(rng.uniform(*rates)), horizon,
                   int(round(refill * horizon)), deadline) for i in range(robots)]

    def ask(robot: Robot) -> None:
        server = rendezvous(robot.name, names)
        batchers[server].submit(ServedRequest(robot.name, (robot, robot.request_id), {}, None, deadline))

    start = time.monotonic()
    queue = [(start + float(rng.uniform(0, 1.0 / r.rate)), i) for i, r in enumerate(fleet)]
    heapq.heapify(queue)
    while queue[0][0] < start + seconds:
        at, i = heapq.heappop(queue)
        time.sleep(max(0.0, at - time.monotonic()))
        with lock:
            fleet[i].tick(time.monotonic(), ask)
        heapq.heappush(queue, (at + 1.0 / fleet[i].rate, i))
    elapsed = time.monotonic() - start
    for batcher in batchers.values():
        batcher.stop(10.0)
    rows = [n for policy in policies.values() for n in policy.rows]
    fill = [n / (smallest_holding(batch_buckets(max_batch), n) or n) for n in rows]
    trips = [t for r in fleet for t in r.round_trips]
    starved = [r.starved / max(r.ticks, 1) for r in fleet]
    return {
        'robots': robots, 'servers': servers, 'window_ms': window * 1e3, 'max_batch': max_batch,
        'batches': len(rows), 'mean_batch': float(np.mean(rows)) if rows else 0.0,
        'bucket_fill': float(np.mean(fill)) if fill else 0.0,
        'queue_wait_mean_ms': float(np.mean(waits)) * 1e3 if waits else float('nan'),
        'queue_wait_p99_ms': float(np.percentile(waits, 99)) * 1e3 if waits else float('nan'),
        'answer_p50_ms': float(np.percentile(trips, 50)) * 1e3 if trips else float('nan'),
        'answer_p99_ms': float(np.percentile(trips, 99)) * 1e3 if trips else float('nan'),
        'starved_mean_pct': 100 * float(np.mean(starved)), 'starved_worst_pct': 100 * float(np.max(starved)),
        'wasted': sum(r.wasted for r in fleet),
        'useful_per_s': len(trips) / elapsed,
        'expired': sum(b.stats['counters']['expired_requests'] for b in batchers.values()),
        'chunks_per_s': served[0] / elapsed,
        'demand_per_s': sum(r.rate / (horizon - int(round(refill * horizon))) for r in fleet),
    }


def projection(costs: dict[int, float], demand: float, deadline: float) -> dict:
    """
    Robots one server carries, from per-batch costs: steady state, latency within ``deadline``.

    A server running batches back to back takes in each batch what arrived during the last:
    with N robots asking ``demand`` chunks/s each, a batch of b rows lasting c(b) holds
    N * demand * c(b) requests, so N = b / (demand * c(b)). A request waits up to one batch
    and then runs in the next: 2 c(b) <= deadline. The best b gives the capacity.
    """
    best = {'robots': 0.0, 'batch': 0, 'batch_ms': 0.0}
    for batch, seconds in sorted(costs.items()):
        robots = batch / (demand * seconds)
        if 2 * seconds <= deadline and robots > best['robots']:
            best = {'robots': robots, 'batch': batch, 'batch_ms': seconds * 1e3}
    return best


def measure_costs(model: str, sizes: list[int], iters: int, threads: int) -> dict[int, float]:
    """Time one batch per size of the ``model`` policy in this process (benchmarks.remote's --batch-cost)."""
    from benchmarks.remote import batch_cost
    return {row['batch']: row['median_ms'] / 1e3 for row in batch_cost(model, sizes, iters, threads)}


def svg(results: list[dict], path: Path) -> None:
    """Draw p99 request-to-answer and starved ticks against the fleet size, one line per configuration."""
    configs = sorted({(r['servers'], r['window_ms'], r['max_batch']) for r in results})
    colours = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd']
    fleet = sorted({r['robots'] for r in results})
    width, height, pad = 360, 240, 48
    panels = [('answer_p99_ms', 'request to answer p99 (ms)'), ('starved_mean_pct', 'starved ticks (% mean)')]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * width + 40}" height="{height + 70}" '
             'font-family="sans-serif" font-size="11">', '<rect width="100%" height="100%" fill="white"/>']
    for p, (key, title) in enumerate(panels):
        x0 = 20 + p * (width + 20)
        top = max(max(r[key] for r in results), 1e-9) * 1.1
        xs = {n: x0 + pad + (width - pad - 10) * k / max(len(fleet) - 1, 1) for k, n in enumerate(fleet)}
        y = lambda v: 20 + (height - pad) * (1 - v / top)  # noqa: E731
        parts.append(f'<text x="{x0 + width / 2}" y="14" text-anchor="middle">{title}</text>')
        parts.append(f'<line x1="{x0 + pad}" y1="{y(0)}" x2="{x0 + width - 10}" y2="{y(0)}" stroke="black"/>')
        parts.append(f'<line x1="{x0 + pad}" y1="20" x2="{x0 + pad}" y2="{y(0)}" stroke="black"/>')
        for tick in np.linspace(0, top / 1.1, 5):
            parts.append(f'<text x="{x0 + pad - 4}" y="{y(tick) + 4}" text-anchor="end">{tick:.0f}</text>')
        for n, x in xs.items():
            parts.append(f'<text x="{x}" y="{y(0) + 14}" text-anchor="middle">{n}</text>')
        parts.append(f'<text x="{x0 + width / 2}" y="{y(0) + 28}" text-anchor="middle">robots</text>')
        for c, config in enumerate(configs):
            rows = sorted((r for r in results if (r['servers'], r['window_ms'], r['max_batch']) == config),
                          key=lambda r: r['robots'])
            points = ' '.join(f'{xs[r["robots"]]:.1f},{y(r[key]):.1f}' for r in rows)
            parts.append(f'<polyline points="{points}" fill="none" stroke="{colours[c % 4]}" stroke-width="2"/>')
    for c, (servers, window, max_batch) in enumerate(configs):
        label = f'{servers} server{"s" if servers > 1 else ""}, ' + (
            f'window {window:g} ms' if window else 'continuous') + f', max {max_batch}'
        parts.append(f'<rect x="{30 + c * 190}" y="{height + 48}" width="12" height="4" fill="{colours[c % 4]}"/>')
        parts.append(f'<text x="{46 + c * 190}" y="{height + 54}">{label}</text>')
    parts.append('</svg>')
    path.write_text('\n'.join(parts) + '\n')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument('--robots', type=int, nargs='+', default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument('--servers', type=int, nargs='+', default=[1, 2], choices=(1, 2))
    parser.add_argument('--window', type=float, nargs='+', default=[0.0],
                        help='batch windows (s) to compare, 0: continuous (default: %(default)s)')
    parser.add_argument('--seconds', type=float, default=10.0, help='per run (default: %(default)s)')
    parser.add_argument('--rates', type=float, nargs=2, default=[15.0, 30.0], metavar=('LOW', 'HIGH'),
                        help='control rates (Hz), each robot its own (default: %(default)s)')
    parser.add_argument('--horizon', type=int, default=50, help='actions per chunk (default: %(default)s)')
    parser.add_argument('--refill', type=float, default=0.5, help='ask when this fraction is left '
                        '(default: %(default)s)')
    parser.add_argument('--deadline', type=float, default=0.5, help='max_observation_age: older answers '
                        'are refused (default: %(default)s s)')
    parser.add_argument('--max-batch', type=int, nargs='+', default=[16],
                        help='batch.max_size values to compare (default: %(default)s)')
    parser.add_argument('--model', default='tiny', choices=('tiny', 'smolvla'),
                        help='policy whose per-batch cost is measured (default: %(default)s)')
    parser.add_argument('--costs', type=Path, help='per-batch costs from benchmarks.remote --batch-cost --json '
                        'instead of measuring here')
    parser.add_argument('--padded', action='store_true', help='a batch costs its bucket (CUDA graphs)')
    parser.add_argument('--iters', type=int, default=3, help='timed batches per size (default: %(default)s)')
    parser.add_argument('--threads', type=int, default=1, help='torch threads while measuring costs')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--json', type=Path)
    parser.add_argument('--svg', type=Path)
    args = parser.parse_args(argv)
    sizes = list(batch_buckets(max(args.max_batch)))
    if args.costs:
        measured = {row['batch']: row['median_ms'] / 1e3 for row in json.loads(args.costs.read_text())['batch_cost']}
    else:
        measured = measure_costs(args.model, sizes, args.iters, args.threads)
    costs = BatchCosts(measured, args.padded)
    print('per-batch cost (ms): ' + ', '.join(f'{n}: {s * 1e3:.1f}' for n, s in sorted(measured.items())),
          file=sys.stderr)
    results = []
    for max_batch in args.max_batch:
        for servers in args.servers:
            for window in args.window:
                for robots in args.robots:
                    row = run_fleet(robots, servers, costs, window, args.seconds, tuple(args.rates),
                                    args.horizon, args.refill, args.deadline, max_batch, args.seed)
                    results.append(row)
                    print(json.dumps(row), file=sys.stderr)
    demand = float(np.mean(args.rates)) / (args.horizon - round(args.refill * args.horizon))
    report = {'costs_ms': {n: s * 1e3 for n, s in sorted(measured.items())}, 'runs': results,
              'projection': projection(measured, demand, args.deadline), 'demand_per_robot': demand}
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    if args.svg:
        svg(results, args.svg)
    return 0


if __name__ == '__main__':
    sys.exit(main())
