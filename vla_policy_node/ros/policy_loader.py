# SPDX-License-Identifier: Apache-2.0
"""
Build the policy the node drives: device choice, torch threads, tiny model or checkpoint.

Kept apart from node.py because it is the only ROS-side module that touches torch. A CUDA
request on a machine without a usable GPU falls back to the CPU instead of failing, with a
WARN line: a robot should rather run slowly than not start because of a config copied from
a GPU machine.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
from pathlib import Path
from typing import Any

import torch

from vla_policy_node.runtime.openmp import release_thread_team
from vla_policy_node.runtime.policy import resolve_device
from vla_policy_node.runtime.warmup import error_summary
from vla_policy_node.runtime.engine import PolicyRuntime, RuntimeConfig
from vla_policy_node.loading import build_tiny_policy, load_policy
from vla_policy_node.ros.params import PolicySettings


class PolicyLoadError(RuntimeError):
    """The policy could not be built or does not fit the configured robot."""


def feature_names(camera_names: tuple[str, ...]) -> tuple[str, ...]:
    """Full policy feature names ("observation.images.front") for configured camera names."""
    prefix = 'observation.images.'
    return tuple(name if name.startswith(prefix) else prefix + name for name in camera_names)


def make_policy(settings: PolicySettings, info: Callable[[str], None], warn: Callable[[str], None],
                batch_sizes: tuple[int, ...] = (), horizon: int = 0, guided: bool = False) -> Any:
    """
    Build or load the policy, check it fits the configured cameras and joints, warm it up.

    ``batch_sizes``: the batch sizes CUDA graphs or compiled programs are built for in the
    warm-up (a server's; empty: the warm-up observation's, one row). ``horizon``: the actions
    a chunk must hold (0: any); ``guided``: chunks are guided (RTC), which runs eager.
    """
    try:
        torch_device, fallback = resolve_device(settings.device)
    except ValueError as error:
        raise PolicyLoadError(str(error)) from error
    if fallback:
        warn(fallback)
    if settings.num_threads > 0:
        torch.set_num_threads(settings.num_threads)
    policy = _build(settings, torch_device)
    _check_fits(policy, settings, horizon, warn)
    # Graphs (CUDA only) and compiled code are specialised to the input shapes: 'longest'
    # padding is served by a few prompt lengths, a server's batches by a few sizes, all
    # captured or compiled (or loaded from the cache) in the warm-up, none mid-control.
    # Guided (rtc) sampling needs autograd and always runs eager, so compiling would buy nothing.
    compile_code = settings.torch_compile
    if compile_code and guided:
        warn("compile is off: with chunking.blend 'rtc' every chunk but an episode's first is guided (eager)")
        compile_code = False
    elif compile_code and settings.cuda_graphs and torch_device.type == 'cuda':
        warn('compile is ignored: on CUDA, cuda_graphs captures the prefix pass and the loop')
        compile_code = False
    runtime = policy.runtime
    config = RuntimeConfig(
        cuda_graphs=settings.cuda_graphs, torch_compile=compile_code, batch_sizes=tuple(batch_sizes),
        trace=settings.trace,
        compile_cache_dir=Path(settings.compile_cache_dir).expanduser() if settings.compile_cache_dir else None)
    _warm_up(policy, config, warn)
    if runtime.program_cache is not None:
        cache = runtime.program_cache
        info(f'compile cache {cache.root}: {cache.stats.loaded} programs loaded, {cache.stats.built} compiled '
             f'({cache.stats.rebuilt} entries found corrupt or foreign and rebuilt)')
    if policy.build_report:
        warn(policy.build_report)
    if policy.compile_report:
        (info if runtime.torch_compile else warn)(policy.compile_report)
    if runtime.traces.report:
        warn(runtime.traces.report)
    if policy.threads_report:
        info(policy.threads_report)
    info(f'policy ready: {policy.describe()}' + (' (compiled)' if runtime.torch_compile else '')
         + built_shapes(runtime))
    if torch_device.type == 'cpu':
        release_thread_team()          # the inference thread's OpenMP team is then the process's only one
    return policy


def _build(settings: PolicySettings, torch_device: torch.device) -> Any:
    """Load the checkpoint, or build the tiny model with random weights when there is none."""
    joints = len(settings.joint_names)
    try:
        if settings.checkpoint:
            roots = (settings.checkpoint_root,) if settings.checkpoint_root else ()
            return load_policy(settings.checkpoint, device=torch_device, dtype=settings.dtype, allowed_roots=roots)
        return build_tiny_policy(
            camera_names=feature_names(settings.camera_names), state_dim=joints, action_dim=joints,
            chunk_size=settings.tiny_chunk_size, num_steps=settings.tiny_num_steps,
            device=torch_device, dtype=settings.dtype, seed=settings.tiny_seed)
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        raise PolicyLoadError(f'could not load the policy: {error}') from error


def _check_fits(policy: Any, settings: PolicySettings, horizon: int, warn: Callable[[str], None]) -> None:
    """Check the configured cameras are the policy's inputs, the joints its state and action, the horizon fits."""
    cameras = feature_names(settings.camera_names)
    joints = len(settings.joint_names)
    masked = sorted(set(policy.camera_names) - set(cameras))
    if masked:
        warn(f'the policy also expects cameras {masked}; no topic feeds them, so they are masked '
             '(the policy acts without those views)')
    unknown = sorted(set(cameras) - set(policy.camera_names))
    if unknown:
        raise PolicyLoadError(
            f'camera_names {unknown} are not inputs of the policy '
            f'(it has {list(policy.camera_names)})')
    if policy.state_dim != joints or policy.action_dim != joints:
        raise PolicyLoadError(
            f'the policy has state_dim {policy.state_dim} and action_dim {policy.action_dim}, '
            f'but joint_names has {joints} joints')
    if horizon > policy.chunk_size:
        raise PolicyLoadError(
            f'chunking.horizon {horizon} exceeds the policy chunk size {policy.chunk_size}')


def _warm_up(policy: Any, config: RuntimeConfig, warn: Callable[[str], None]) -> None:
    """Run one inference before commanding; compiled code that fails to build falls back to eager."""
    runtime = policy.runtime
    runtime.configure(config)
    try:
        try:
            policy.warmup(policy.dummy_observation())
        except Exception as error:  # noqa: B902 - the compiler fails in many ways (no toolchain, lowering)
            if not runtime.torch_compile:
                raise
            warn(f'compile failed, running eager: {error_summary(error)}')
            runtime.configure(dataclasses.replace(config, torch_compile=False))
            policy.warmup(policy.dummy_observation())
    except (MemoryError, RuntimeError, ValueError) as error:     # the allocator's, a CUDA error, a bad shape
        raise PolicyLoadError(f'the warm-up (one inference before commanding) failed: {error_summary(error)}') \
            from error


def built_shapes(runtime: PolicyRuntime) -> str:
    """Say which batch sizes and prompt lengths the warm-up built graphs or programs for ('' if none)."""
    if not (runtime.torch_compile or runtime.cuda_graphs_active):
        return ''
    parts = [f'{name} {", ".join(map(str, sizes))}'
             for name, sizes in (('batch sizes', runtime.batch_sizes), ('prompt lengths', runtime.prompt_lengths))
             if sizes]
    what = 'CUDA graphs' if runtime.cuda_graphs_active else 'programs'
    return f'; {what} built for {"; ".join(parts)}' if parts else ''
