# SPDX-License-Identifier: Apache-2.0
"""
Real-time chunking (RTC): guide a new action chunk toward the actions already committed.

Black et al. 2025, "Real-Time Execution of Action Chunking Flow Policies". While a
chunk is being computed the robot keeps executing the previous one, so the first
``d`` actions of the new chunk (``d`` = inference delay in control steps) will never
run, and the rest of the overlap should agree with what the robot is about to do.
Instead of blending two chunks after the fact, RTC inpaints during denoising: at
every flow step the velocity is corrected so that the predicted clean chunk moves
toward the committed prefix, with full weight on the first ``d`` actions and an
exponentially decaying weight over the rest of the overlap.

Flow convention (openpi / LeRobot, and our ``flow.py``)::

    x_t = t * noise + (1 - t) * actions,  the model predicts v = noise - actions,
    Euler from t = 1 (noise) to t = 0 with dt = -1 / num_steps,
    so step k is at t_k = 1 - k / num_steps and the predicted clean chunk is
    x0_hat(x_t) = x_t - t * v(x_t, t)                       (the paper's A^1 hat).

The paper's time runs the other way (tau = 1 - t) and its velocity has the opposite
sign, so its ``v + w * g`` becomes ``v - w * g`` here, with::

    g = ((A_prev - x0_hat) * W)^T  d x0_hat / d x_t        (one vector-Jacobian product)
    w = min(beta, (t^2 + (1 - t)^2) / (t * (1 - t)))        (the paper's (1 - tau) / (tau r^2))

Autograd must be available: run the denoising loop under ``torch.no_grad()``, not
``torch.inference_mode()`` (inference tensors cannot enter a backward graph). Only the
noisy chunk ``x_t`` gets a gradient; weights and the prefix cache are never written.

``guidance="lerobot"`` reproduces LeRobot's ``RTCProcessor.denoise_step``
(``lerobot/policies/rtc/modeling_rtc.py``, default ``RTCConfig``) for users who evaluated
there: the velocity is computed before ``x_t`` joins the graph, so the Jacobian is skipped
(``g = (A_prev - x0_hat) * W``, no backward pass, no autograd needed); the prefix is
zero-padded to the whole chunk width, so padded action dims are pulled toward 0; ``W``
decays linearly (LeRobot's default ``LINEAR`` schedule) instead of exponentially; only the
first ``execution_horizon`` committed actions guide (LeRobot's ``RTCConfig.execution_horizon``,
default 10; the delay is cut to it, as ``get_prefix_weights`` does). The
paper's guidance stays the default: it is the derivation in Black et al. and it lets the
guidance reach actions the model couples in time. On LeRobot's own test case (v = 0.5 x,
x = 1, prefix 0.1, t = 0.5) the guided velocity is 1.8 with ``lerobot`` and 1.475 with
``paper`` (the Jacobian 1 - 0.5 t scales the correction by 0.75).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from vla_policy_node.control.chunking import RTC_GUIDANCE
from vla_policy_node.model.flow import VelocityFn

SCHEDULES = ("exp", "linear")


def prefix_weights(delay: int, overlap: int, horizon: int, schedule: str = "exp") -> np.ndarray:
    """
    Soft mask ``W`` (horizon,) over the new chunk: how hard each action is pulled.

    ``W_i = 1`` for ``i < delay`` (those actions run before the chunk arrives),
    ``W_i = c_i (e^c_i - 1) / (e - 1)`` (``exp``, the paper) or ``c_i`` (``linear``, LeRobot's
    default) with ``c_i = (overlap - i) / (overlap - delay + 1)`` for ``delay <= i < overlap``,
    and 0 after the overlap. ``overlap`` is the number of committed actions (the paper's
    ``H - s``). Example, delay=2, overlap=5, horizon=7, exp: ``[1, 1, 0.49, 0.19, 0.04, 0, 0]``.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if not 0 <= delay <= overlap <= horizon:
        raise ValueError(
            f"need 0 <= delay <= overlap <= horizon, got delay={delay}, overlap={overlap}, horizon={horizon}"
        )
    weights = np.zeros(horizon)
    weights[:delay] = 1.0
    i = np.arange(delay, overlap)
    c = (overlap - i) / (overlap - delay + 1)
    weights[delay:overlap] = c * np.expm1(c) / (math.e - 1.0) if schedule == "exp" else c
    return weights


def guidance_weight(t: float, max_guidance_weight: float) -> float:
    """Guidance strength at flow time ``t``: large near noise, clipped at ``beta``."""
    if max_guidance_weight <= 0:
        raise ValueError(f"max_guidance_weight must be > 0, got {max_guidance_weight}")
    if t <= 0.0 or t >= 1.0:
        return max_guidance_weight
    return min(max_guidance_weight, (t * t + (1.0 - t) ** 2) / (t * (1.0 - t)))


def guided_velocity(
    x_t: Tensor,
    t: float,
    velocity: Callable[[Tensor], Tensor],
    prefix: Tensor | np.ndarray,
    delay: int,
    max_guidance_weight: float,
    guidance: str = "paper",
) -> Tensor:
    """
    One RTC-guided velocity at flow time ``t`` (see module docstring for the math).

    x_t: (B, H, A) or (H, A) noisy chunk. velocity: ``x_t -> v`` at this ``t``.
    prefix: (K, A_p) or (B, K, A_p) committed actions in the model's (normalized)
    action space; ``A_p <= A``: the paper's guidance leaves the padded action dims
    unguided, LeRobot's pulls them toward 0. ``K == 0`` returns the plain velocity.
    """
    if guidance not in RTC_GUIDANCE:
        raise ValueError(f"guidance must be one of {RTC_GUIDANCE}, got {guidance!r}")
    if guidance == "paper" and (torch.is_inference_mode_enabled() or x_t.is_inference()):
        raise RuntimeError(
            "RTC guidance needs autograd: run denoising under torch.no_grad(), not torch.inference_mode()"
        )
    horizon, action_dim = x_t.shape[-2:]
    if isinstance(prefix, np.ndarray):
        prefix = torch.from_numpy(prefix.copy())  # the scheduler's prefix is read-only
    prefix = prefix.to(dtype=x_t.dtype, device=x_t.device)
    overlap, prefix_dim = prefix.shape[-2:]
    if prefix_dim > action_dim:
        raise ValueError(f"prefix has {prefix_dim} action dims, the chunk only {action_dim}")
    if overlap == 0:
        return velocity(x_t)
    if guidance == "lerobot":
        return _lerobot_guided_velocity(x_t, t, velocity, prefix, delay, max_guidance_weight)
    mask = torch.as_tensor(prefix_weights(delay, overlap, horizon), dtype=x_t.dtype, device=x_t.device)
    with torch.enable_grad():
        x = x_t.detach().requires_grad_(True)
        v = velocity(x)
        x0_hat = x - t * v
        error = torch.zeros_like(x0_hat)
        error[..., :overlap, :prefix_dim] = prefix - x0_hat[..., :overlap, :prefix_dim].detach()
        (correction,) = torch.autograd.grad(x0_hat, x, grad_outputs=error * mask[:, None])
    return (v - guidance_weight(t, max_guidance_weight) * correction).detach()


def _lerobot_guided_velocity(x_t: Tensor, t: float, velocity: Callable[[Tensor], Tensor], prefix: Tensor,
                             delay: int, max_guidance_weight: float) -> Tensor:
    """Guide as LeRobot does: no Jacobian, prefix zero-padded to (H, A), linear prefix weights."""
    horizon = x_t.shape[-2]
    overlap, prefix_dim = prefix.shape[-2:]
    v = velocity(x_t)
    x0_hat = x_t - t * v
    target = torch.zeros_like(x0_hat)
    target[..., :overlap, :prefix_dim] = prefix
    mask = torch.as_tensor(prefix_weights(delay, overlap, horizon, "linear"), dtype=x_t.dtype, device=x_t.device)
    return v - guidance_weight(t, max_guidance_weight) * (target - x0_hat) * mask[:, None]


def lerobot_horizon(prefix: Tensor | np.ndarray, delay: int, guidance: str, execution_horizon: int | None
                    ) -> tuple[Tensor | np.ndarray, int]:
    """Cut the prefix to LeRobot's ``execution_horizon`` (its guidance sees no more), and the delay with it."""
    if guidance != "lerobot" or execution_horizon is None:
        return prefix, delay
    if execution_horizon < 1:
        raise ValueError(f"execution_horizon must be >= 1, got {execution_horizon}")
    prefix = prefix[..., :execution_horizon, :]
    return prefix, min(delay, prefix.shape[-2])


def rtc_guided_velocity(
    velocity_fn: VelocityFn,
    prefix: Tensor | np.ndarray,
    delay: int,
    num_steps: int,
    max_guidance_weight: float = 10.0,
    guidance: str = "paper",
    execution_horizon: int | None = None,
) -> VelocityFn:
    """
    Wrap ``velocity_fn`` for the Euler loop so every step is RTC-guided.

    Step ``k`` is taken at ``t = 1 + k * dt``, ``dt = -1 / num_steps`` (``flow.euler_schedule``).
    Plugs into ``PolicyRuntime.sample(guide=lambda v: rtc_guided_velocity(v, ...))``.
    prefix: (K, A_p) committed actions, normalized like the model's actions;
    delay: inference delay in control steps (``0 <= delay <= K``);
    guidance: ``paper`` (vector-Jacobian product) or ``lerobot`` (see module docstring);
    execution_horizon: with ``lerobot``, the committed actions that guide (None: all).
    """
    prefix, delay = lerobot_horizon(prefix, delay, guidance, execution_horizon)
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    overlap = np.shape(prefix)[-2]
    if not 0 <= delay <= overlap:
        raise ValueError(f"delay must be in [0, {overlap}] (the prefix length), got {delay}")
    if max_guidance_weight <= 0:
        raise ValueError(f"max_guidance_weight must be > 0, got {max_guidance_weight}")
    if guidance not in RTC_GUIDANCE:
        raise ValueError(f"guidance must be one of {RTC_GUIDANCE}, got {guidance!r}")

    def guided(x_t: Tensor, step_index: int) -> Tensor:
        return guided_velocity(
            x_t,
            1.0 + step_index * (-1.0 / num_steps),
            lambda x: velocity_fn(x, step_index),
            prefix,
            delay,
            max_guidance_weight,
            guidance,
        )

    return guided


def batch_guided_velocity(
    x_t: Tensor,
    t: float,
    velocity: Callable[[Tensor], Tensor],
    targets: Tensor,
    weights: Tensor,
    betas: Tensor,
    paper: Tensor,
) -> Tensor:
    """
    RTC guidance with its own prefix, delay, clip and kind per batch item (one model call).

    x_t: (B, H, A). targets: (B, H, A) committed actions, normalized, zero where unguided.
    weights: (B, H, A) ``W`` per action and dim (0 for an item without guidance, beyond its
    overlap, and on padded dims under ``paper``). betas: (B,) clips. paper: (B,) bool, the
    paper's guidance (vector-Jacobian product) for True, LeRobot's for False. Each item gets
    exactly what :func:`guided_velocity` gives it alone: the model treats items independently,
    so one vector-Jacobian product over the batch yields every item's own.
    """
    scale = torch.tensor([guidance_weight(t, float(b)) for b in betas], dtype=x_t.dtype,
                         device=x_t.device)[:, None, None]
    if not bool(paper.any()):
        v = velocity(x_t)
        return v - scale * (targets - (x_t - t * v)) * weights
    if torch.is_inference_mode_enabled() or x_t.is_inference():
        raise RuntimeError(
            "RTC guidance needs autograd: run denoising under torch.no_grad(), not torch.inference_mode()"
        )
    by_vjp = paper.to(x_t.device)[:, None, None]
    with torch.enable_grad():
        x = x_t.detach().requires_grad_(True)
        v = velocity(x)
        x0_hat = x - t * v
        error = (targets - x0_hat.detach()) * weights
        (jacobian_part,) = torch.autograd.grad(x0_hat, x, grad_outputs=torch.where(by_vjp, error, 0.0))
    return (v - scale * torch.where(by_vjp, jacobian_part, error)).detach()


def batch_rtc_guide(
    velocity_fn: VelocityFn,
    prefixes: list[np.ndarray | None],
    delays: list[int],
    betas: list[float],
    guidances: list[str],
    horizon: int,
    action_dim: int,
    num_steps: int,
    execution_horizons: list[int | None] | None = None,
) -> VelocityFn:
    """
    Wrap ``velocity_fn`` so item ``b`` is guided by ``prefixes[b]`` (K_b, A_p), or not at all (None).

    The batched form of :func:`rtc_guided_velocity` for a server that denoises several robots'
    chunks in one loop; prefixes are normalized like the model's actions. ``execution_horizons``
    (one per item, None: all) cut LeRobot-guided prefixes as :func:`rtc_guided_velocity` does.
    """
    batch = len(prefixes)
    horizons = execution_horizons or [None] * batch
    if not len(delays) == len(betas) == len(guidances) == batch:
        raise ValueError("prefixes, delays, betas and guidances must have one entry per batch item")
    targets = np.zeros((batch, horizon, action_dim), np.float32)
    weights = np.zeros((batch, horizon, action_dim), np.float32)
    for b, (prefix, delay, guidance, execution_horizon) in enumerate(zip(prefixes, delays, guidances, horizons)):
        if guidance not in RTC_GUIDANCE:
            raise ValueError(f"guidance must be one of {RTC_GUIDANCE}, got {guidance!r}")
        if prefix is None or len(prefix) == 0:
            continue
        prefix, delay = lerobot_horizon(prefix, delay, guidance, execution_horizon)
        overlap, prefix_dim = prefix.shape
        if prefix_dim > action_dim:
            raise ValueError(f"prefix has {prefix_dim} action dims, the chunk only {action_dim}")
        schedule = "exp" if guidance == "paper" else "linear"
        dims = prefix_dim if guidance == "paper" else action_dim
        targets[b, :overlap, :prefix_dim] = prefix
        weights[b, :, :dims] = prefix_weights(delay, overlap, horizon, schedule)[:, None]
    paper = torch.tensor([g == "paper" for g in guidances])
    beta = torch.tensor(betas, dtype=torch.float64)
    for value in betas:
        if value <= 0:
            raise ValueError(f"max_guidance_weight must be > 0, got {value}")

    def guided(x_t: Tensor, step_index: int) -> Tensor:
        return batch_guided_velocity(
            x_t, 1.0 + step_index * (-1.0 / num_steps), lambda x: velocity_fn(x, step_index),
            torch.from_numpy(targets).to(x_t.device, x_t.dtype),
            torch.from_numpy(weights).to(x_t.device, x_t.dtype), beta, paper)

    return guided
