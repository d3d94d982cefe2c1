# SPDX-License-Identifier: Apache-2.0
"""
Flow-matching sampling: the fixed Euler schedule and a stateless integrator.

Convention (LeRobot / openpi): x at t=1 is noise, the model predicts the
velocity v = noise - actions, and the integrator steps t from 1 to 0 with
dt = -1/num_steps; t_k is float32(1 + k*dt), the value the reference feeds its
time embedding.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

VelocityFn = Callable[[Tensor, int], Tensor]
"""``velocity_fn(x_t, step_index) -> v``; x_t and v are (B, T, A)."""


def euler_schedule(num_steps: int) -> tuple[Tensor, Tensor]:
    """Return the times t_k = float32(1 + k*dt) (num_steps,) and the float32 step dt (scalar tensor)."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    dt = -1.0 / num_steps
    times = torch.tensor([1.0 + k * dt for k in range(num_steps)], dtype=torch.float32)
    return times, torch.tensor(dt, dtype=torch.float32)


def euler_integrate(velocity_fn: VelocityFn, x_init: Tensor, dt: Tensor, num_steps: int) -> Tensor:
    """Integrate from t=1 (x_init = noise) to t=0: x <- x + dt * v(x, k)."""
    x = x_init
    dt = dt.to(x.device)
    for k in range(num_steps):
        x = x + dt * velocity_fn(x, k)
    return x
