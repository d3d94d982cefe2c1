# SPDX-License-Identifier: Apache-2.0
"""
Data-parallel training over worker processes on one machine, one CPU core each.

The shipped policy's kernels are too narrow for two torch threads to split (two threads train
it at most 1.25 times as fast as one), but two processes of one thread each compute two
half-batches at once (BENCHMARKS.md "Task success" has the steps per second of two workers).
After each backward pass one all-reduce averages the gradients (and the loss), so every
worker applies the same AdamW update and the weights stay identical without being sent.
The workers meet through a file in a temporary folder and talk over gloo on the loopback
interface only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
import os
from pathlib import Path
import tempfile
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn


@dataclass(frozen=True)
class Worker:
    """This process's place among the workers; rank 0 saves, evaluates and reports."""

    rank: int = 0
    world: int = 1

    @property
    def leader(self) -> bool:
        return self.rank == 0


def run(fn: Callable[..., Any], workers: int, *args: Any) -> None:
    """Run ``fn(worker, *args)`` in ``workers`` fresh processes with 1 torch thread each; raises if one fails."""
    if workers < 2:
        raise ValueError(f"data-parallel training needs at least 2 workers, got {workers}")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")        # worker traffic stays on this machine
    with tempfile.TemporaryDirectory(prefix="vla-policy-train-") as folder:
        mp.spawn(_entry, args=(workers, Path(folder) / "rendezvous", fn, args), nprocs=workers, join=True)


def _entry(rank: int, world: int, rendezvous: Path, fn: Callable[..., Any], args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        fn(Worker(rank, world), *args)
    finally:
        dist.destroy_process_group()


def synchronise(worker: Worker) -> None:
    """Wait until every worker gets here (e.g. rank 0 has written a file the others read)."""
    if worker.world > 1:
        dist.barrier()


def broadcast_parameters(model: nn.Module, worker: Worker) -> None:
    """Give every worker rank 0's weights (identical seeds make them equal already; this makes it certain)."""
    if worker.world > 1:
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def pooled_sums(values: np.ndarray, worker: Worker) -> np.ndarray:
    """Return the sum of ``values`` (float64) over the workers: how shard statistics become global ones."""
    if worker.world == 1:
        return np.asarray(values, dtype=np.float64)
    flat = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64)).clone()
    dist.all_reduce(flat)
    return flat.numpy()


def average_gradients(parameters: Iterable[nn.Parameter], loss: Tensor, worker: Worker) -> float:
    """Replace each gradient by its mean over the workers, in one all-reduce; returns the mean loss."""
    if worker.world == 1:
        return loss.item()
    grads = [p.grad for p in parameters if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)])
    dist.all_reduce(flat)
    flat /= worker.world
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    return flat[-1].item()
