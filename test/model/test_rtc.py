# SPDX-License-Identifier: Apache-2.0
"""RTC guidance on velocity fields whose answer is known in closed form."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vla_policy_node.control.chunking import RTCGuidance
from vla_policy_node.model.rtc import guidance_weight, guided_velocity, prefix_weights, rtc_guided_velocity

H, A, STEPS = 8, 3, 10


def euler(velocity_fn, noise: torch.Tensor, num_steps: int = STEPS) -> torch.Tensor:
    """Integrate with the openpi loop: t from 1 to 0, dt = -1/num_steps."""
    x = noise
    for k in range(num_steps):
        x = x + (-1.0 / num_steps) * velocity_fn(x, k)
    return x


def gaussian_velocity(mean: torch.Tensor, std: float, num_steps: int = STEPS):
    """
    Exact flow velocity for actions ~ N(mean, std^2) per element, noise ~ N(0, 1).

    x_t = t z + (1 - t) a, so E[a | x_t] = mean + (1-t) std^2 / ((1-t)^2 std^2 + t^2) (x_t - (1-t) mean)
    and v = (x_t - E[a | x_t]) / t.
    """

    def velocity_fn(x: torch.Tensor, k: int) -> torch.Tensor:
        t = 1.0 - k / num_steps
        gain = (1 - t) * std**2 / ((1 - t) ** 2 * std**2 + t**2)
        clean = mean + gain * (x - (1 - t) * mean)
        return (x - clean) / t

    return velocity_fn


def test_prefix_weights_by_hand():
    c = np.array([3 / 4, 2 / 4, 1 / 4])
    expected = np.r_[1.0, 1.0, c * np.expm1(c) / (np.e - 1), 0.0, 0.0]
    np.testing.assert_allclose(prefix_weights(2, 5, 7), expected)
    np.testing.assert_array_equal(prefix_weights(0, 0, 4), np.zeros(4))
    np.testing.assert_array_equal(prefix_weights(3, 3, 4), [1, 1, 1, 0])
    assert np.all(np.diff(prefix_weights(0, 6, 6)) < 0)  # decays over the soft part
    for bad in ((3, 2, 4), (-1, 2, 4), (0, 5, 4)):
        with pytest.raises(ValueError, match="delay <= overlap <= horizon"):
            prefix_weights(*bad)


def test_guidance_weight_schedule():
    assert guidance_weight(1.0, 10.0) == 10.0  # pure noise: clipped at beta
    assert guidance_weight(0.5, 10.0) == pytest.approx(2.0)  # (0.25 + 0.25) / 0.25
    assert guidance_weight(0.9, 10.0) == pytest.approx(0.82 / 0.09)
    assert guidance_weight(0.97, 10.0) == 10.0
    with pytest.raises(ValueError, match="max_guidance_weight"):
        guidance_weight(0.5, 0.0)


def test_vector_jacobian_product_of_a_time_mixing_field():
    # v(x) = M x + b mixes time steps, so d x0_hat / d x_t = I - t M is not diagonal.
    gen = torch.Generator().manual_seed(0)
    m = torch.randn(H, H, generator=gen, dtype=torch.float64) / H
    b = torch.randn(H, A, generator=gen, dtype=torch.float64)
    x = torch.randn(H, A, generator=gen, dtype=torch.float64)
    prefix = torch.randn(4, 2, generator=gen, dtype=torch.float64)  # K=4, only 2 of 3 dims guided
    t, delay, beta = 0.7, 2, 10.0
    with torch.no_grad():  # the policy runs inference without autograd
        out = guided_velocity(x, t, lambda z: m @ z + b, prefix, delay, beta)

    v = m @ x + b
    error = torch.zeros(H, A, dtype=torch.float64)
    error[:4, :2] = prefix - (x - t * v)[:4, :2]
    error *= torch.as_tensor(prefix_weights(delay, 4, H))[:, None]
    correction = (torch.eye(H, dtype=torch.float64) - t * m).T @ error
    torch.testing.assert_close(out, v - guidance_weight(t, beta) * correction)
    assert not out.requires_grad


def test_guidance_pulls_the_delayed_actions_onto_the_prefix():
    mean = torch.zeros(H, A, dtype=torch.float64)
    noise = torch.randn(2, H, A, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    prefix = torch.full((5, A), 1.5, dtype=torch.float64)  # committed actions, far from the mean
    velocity_fn = gaussian_velocity(mean, std=1.0)
    with torch.no_grad():
        free = euler(velocity_fn, noise)
        guided = euler(rtc_guided_velocity(velocity_fn, prefix, delay=3, num_steps=STEPS), noise)

    free_error = (free[:, :3] - prefix[:3]).abs()
    guided_error = (guided[:, :3] - prefix[:3]).abs()
    assert guided_error.max() < 0.05 and free_error.mean() > 1.0
    # The soft part is pulled less, in order of its weight; elements are independent in
    # this model, so actions past the overlap are exactly untouched.
    pull = ((guided - free) / (prefix[0, 0] - free)).mean(dim=(0, 2))
    assert torch.all(pull[:5].diff() <= 1e-9)
    torch.testing.assert_close(guided[:, 5:], free[:, 5:])


def test_no_overlap_leaves_the_chunk_unchanged():
    velocity_fn = gaussian_velocity(torch.zeros(H, A, dtype=torch.float64), std=0.5)
    noise = torch.randn(H, A, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    empty = np.zeros((0, A))
    with torch.no_grad():
        free = euler(velocity_fn, noise)
        guided = euler(rtc_guided_velocity(velocity_fn, empty, delay=0, num_steps=STEPS), noise)
    torch.testing.assert_close(guided, free, rtol=0, atol=0)


def test_numpy_prefix_and_float32_chunk():
    velocity_fn = gaussian_velocity(torch.zeros(1, H, A), std=1.0)
    noise = torch.randn(1, H, A, generator=torch.Generator().manual_seed(3))
    prefix = np.full((4, A), 0.5, dtype=np.float64)
    with torch.no_grad():
        out = euler(rtc_guided_velocity(velocity_fn, prefix, delay=4, num_steps=STEPS), noise)
    assert out.dtype == torch.float32
    assert (out[0, :4] - 0.5).abs().max() < 0.05


def test_rejects_inference_mode_and_bad_arguments():
    velocity_fn = gaussian_velocity(torch.zeros(H, A), std=1.0)
    guided = rtc_guided_velocity(velocity_fn, np.zeros((2, A)), delay=1, num_steps=STEPS)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="no_grad"):
        guided(torch.zeros(H, A), 0)
    with pytest.raises(ValueError, match="delay"):
        rtc_guided_velocity(velocity_fn, np.zeros((2, A)), delay=3, num_steps=STEPS)
    with pytest.raises(ValueError, match="num_steps"):
        rtc_guided_velocity(velocity_fn, np.zeros((2, A)), delay=1, num_steps=0)
    with pytest.raises(ValueError, match="max_guidance_weight"):
        rtc_guided_velocity(velocity_fn, np.zeros((2, A)), delay=1, num_steps=STEPS, max_guidance_weight=-1.0)
    with pytest.raises(ValueError, match="action dims"):
        guided_velocity(torch.zeros(H, A), 0.5, lambda z: z, np.zeros((2, A + 1)), 1, 10.0)


def test_rtc_smooths_chunk_boundaries_in_the_jerk_simulation():
    # End to end: scheduler -> RTCGuidance -> guided flow sampler -> scheduler.
    from benchmarks.jerk import JerkSimConfig, scenarios, simulate

    sim = JerkSimConfig(duration_s=8.0)
    rows = scenarios(sim)
    latest = simulate(sim, rows["latest (no blending)"])
    rtc = simulate(sim, rows["rtc (beta=10)"])
    assert rtc["starved_ticks"] == latest["starved_ticks"] == 0
    assert rtc["boundary_rms"] < 0.3 * latest["boundary_rms"]
    assert rtc["max_step"] < 0.5 * latest["max_step"]


def test_guides_the_tiny_policy_through_its_runtime():
    # The real velocity path (prefix cache read-only, expert under autograd) accepts the wrapper.
    from vla_policy_node.loading import build_tiny_policy

    policy = build_tiny_policy(("front",), state_dim=6, action_dim=6, chunk_size=8, num_steps=4)
    rng = np.random.default_rng(0)
    observation = {"images": {"front": rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)},
                   "state": rng.normal(size=6), "task": "pick the cube"}
    noise = torch.randn(1, 8, policy.model.max_action_dim, generator=torch.Generator().manual_seed(0)).numpy()
    prefix = np.full((5, 6), 0.8)  # normalizer is the identity in the tiny policy
    free = policy.predict_action_chunk(observation, noise)
    passes = policy.stats.prefix_passes
    guided = policy.predict_action_chunk(
        observation, noise, rtc=RTCGuidance(prefix=prefix, delay_steps=3, max_guidance_weight=10.0)
    )
    assert np.abs(guided[0, :3] - 0.8).max() < 0.1 < np.abs(free[0, :3] - 0.8).mean()
    assert policy.stats.prefix_passes == passes + 1  # guidance does not recompute the prefix


# LeRobot's own test cases: huggingface/lerobot tests/policies/rtc/test_modeling_rtc.py
# (commit 2336fbeb), test_denoise_step_with_prev_chunk and
# test_denoise_step_uses_custom_execution_horizon: RTCProcessor.denoise_step with the default
# LINEAR schedule, max_guidance_weight 10, v(x) = 0.5 x, x_t = 1 (20 steps, 1 dim),
# prev chunk 0.1, inference_delay 5, time 0.5. Our prefix is the part LeRobot's execution
# horizon keeps (10 and 15 actions).
LEROBOT_EXPECTED = {
    10: [1.8] * 5 + [1.5833, 1.3667, 1.1500, 0.9333, 0.7167] + [0.5] * 10,
    15: [1.8] * 5 + [1.6818, 1.5636, 1.4455, 1.3273, 1.2091, 1.0909, 0.9727, 0.8545, 0.7364, 0.6182] + [0.5] * 5,
}


@pytest.mark.parametrize("horizon", [10, 15])
def test_lerobot_guidance_reproduces_lerobots_test_case(horizon):
    x = torch.ones(1, 20, 1)
    prefix = torch.full((horizon, 1), 0.1)
    out = guided_velocity(x, 0.5, lambda z: 0.5 * z, prefix, 5, 10.0, guidance="lerobot")
    torch.testing.assert_close(out[0, :, 0], torch.tensor(LEROBOT_EXPECTED[horizon]), atol=1e-4, rtol=0)


def test_paper_guidance_on_lerobots_test_case_keeps_the_jacobian():
    # The paper's g is the vector-Jacobian product: d x0_hat / d x = 1 - 0.5 t = 0.75 here,
    # so the full-weight actions get 0.5 + 2 * 0.65 * 0.75 = 1.475 where LeRobot gives 1.8.
    x = torch.ones(1, 20, 1)
    with torch.no_grad():
        out = guided_velocity(x, 0.5, lambda z: 0.5 * z, torch.full((10, 1), 0.1), 5, 10.0)
    expected = 0.5 + 2.0 * 0.65 * 0.75 * torch.as_tensor(prefix_weights(5, 10, 20), dtype=torch.float32)
    torch.testing.assert_close(out[0, :, 0], expected, atol=1e-6, rtol=0)
    assert out[0, 0, 0].item() == pytest.approx(1.475)


def test_lerobot_guidance_pulls_padded_action_dims_to_zero_and_needs_no_autograd():
    x = torch.full((1, 6, 3), 2.0)
    prefix = torch.full((4, 2), 1.0)                     # 2 robot dims; the third is padding
    with torch.inference_mode():                        # no backward pass: inference mode is fine
        out = guided_velocity(x, 0.5, lambda z: torch.zeros_like(z), prefix, 2, 10.0, guidance="lerobot")
    w = torch.as_tensor(prefix_weights(2, 4, 6, "linear"), dtype=torch.float32)
    # v = 0 so x0_hat = x = 2; the error is (1 - 2) on robot dims and (0 - 2) on the padded one.
    torch.testing.assert_close(out[0, :, 0], 2.0 * w)
    torch.testing.assert_close(out[0, :, 2], 4.0 * w)
    with torch.no_grad():
        paper = guided_velocity(x.clone(), 0.5, lambda z: torch.zeros_like(z), prefix, 2, 10.0)
    assert torch.all(paper[0, :, 2] == 0)              # the paper's guidance leaves padded dims alone
    with pytest.raises(ValueError, match="guidance must be one of"):
        guided_velocity(x, 0.5, lambda z: z, prefix, 2, 10.0, guidance="kinetix")


def test_linear_prefix_weights_match_lerobots_schedule():
    # LeRobot RTCProcessor.get_prefix_weights(start=5, end=14, total=25), LINEAR: leading ones,
    # linspace(1, 0, 11)[1:-1], trailing zeros (test_get_prefix_weights_linear_schedule).
    expected = [1.0] * 5 + [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1] + [0.0] * 11
    np.testing.assert_allclose(prefix_weights(5, 14, 25, "linear"), expected, atol=1e-12)
    with pytest.raises(ValueError, match="schedule"):
        prefix_weights(5, 14, 25, "cosine")


def test_scheduler_passes_the_guidance_choice_to_the_policy_request():
    from vla_policy_node.control.chunking import ChunkScheduler, SchedulerConfig

    with pytest.raises(ValueError, match="rtc_guidance"):
        SchedulerConfig(control_rate_hz=10.0, horizon=8, blend="rtc", rtc_guidance="kinetix")
    scheduler = ChunkScheduler(SchedulerConfig(control_rate_hz=10.0, horizon=8, blend="rtc",
                                               rtc_guidance="lerobot"))
    first = scheduler.begin_request(0.0)
    scheduler.submit_chunk(first, np.zeros((8, 2)), 0.05)
    for k in range(5):
        scheduler.next_action(0.1 * (k + 1))
    assert scheduler.begin_request(0.6).rtc.guidance == "lerobot"


def test_lerobot_guidance_sees_only_its_execution_horizon():
    # LeRobot's RTCProcessor.denoise_step zero-pads the whole left-over chunk as the target but
    # weights it with get_prefix_weights(delay, execution_horizon, T): rows past the horizon get 0.
    # So 20 committed actions with execution_horizon 10 guide exactly as LeRobot's own test case.
    x = torch.ones(1, 20, 1)
    velocity = rtc_guided_velocity(lambda z, k: 0.5 * z, torch.full((20, 1), 0.1), 5, 2, 10.0, "lerobot",
                                   execution_horizon=10)
    out = velocity(x, 1)                                   # step 1 of 2: t = 0.5
    torch.testing.assert_close(out[0, :, 0], torch.tensor(LEROBOT_EXPECTED[10]), atol=1e-4, rtol=0)
    # The delay is cut to the horizon (get_prefix_weights: start = min(start, end)).
    cut = rtc_guided_velocity(lambda z, k: 0.5 * z, torch.full((20, 1), 0.1), 15, 2, 10.0, "lerobot",
                              execution_horizon=10)(x, 1)
    torch.testing.assert_close(cut[0, :10, 0], torch.full((10,), 1.8), atol=1e-4, rtol=0)
    torch.testing.assert_close(cut[0, 10:, 0], torch.full((10,), 0.5), atol=1e-6, rtol=0)
    # The paper's guidance keeps every committed action.
    with torch.no_grad():
        paper = rtc_guided_velocity(lambda z, k: 0.5 * z, torch.full((20, 1), 0.1), 5, 2, 10.0, "paper",
                                    execution_horizon=10)(x, 1)
    assert paper[0, 12, 0].item() != pytest.approx(0.5)


def test_scheduler_sends_the_execution_horizon_only_with_lerobot_guidance():
    from vla_policy_node.control.chunking import ChunkScheduler, SchedulerConfig

    with pytest.raises(ValueError, match="execution_horizon"):
        SchedulerConfig(control_rate_hz=10.0, horizon=8, blend="rtc", execution_horizon=0)
    for guidance, expected in (("lerobot", 3), ("paper", None)):
        scheduler = ChunkScheduler(SchedulerConfig(control_rate_hz=10.0, horizon=8, blend="rtc",
                                                   rtc_guidance=guidance, execution_horizon=3))
        first = scheduler.begin_request(0.0)
        scheduler.submit_chunk(first, np.zeros((8, 2)), 0.05)
        for k in range(5):
            scheduler.next_action(0.1 * (k + 1))
        assert scheduler.begin_request(0.6).rtc.execution_horizon == expected
