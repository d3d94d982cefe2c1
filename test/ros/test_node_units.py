# SPDX-License-Identifier: Apache-2.0
"""
Unit tests (no DDS) of what the node's fault handling is built from.

Header-stamp checks and the observation buffer, the scheduler's read-only ``peek``, clamping
of a whole trajectory, the trajectory message, fault reports for /diagnostics, and the
type check of parameter sources that rcl's merge would hide.
"""

import numpy as np
import pytest

from vla_policy_node.runtime.engine import COMPILED, EAGER
from vla_policy_node.control.chunking import ChunkScheduler, SchedulerConfig
from vla_policy_node.control.safety import MotionLimits, stamp_problem
from vla_policy_node.ros.conversions import chunk_to_joint_trajectory
from vla_policy_node.control.health import ERROR, FaultTally, OK
from vla_policy_node.control.observations import ObservationBuffer
from vla_policy_node.ros.params import check_override_sources, ParameterError

RGB = np.zeros((4, 4, 3), np.uint8)


@pytest.mark.parametrize('stamp, previous, message', [
    (9.9, 9.8, None),
    (9.3, None, 'header stamp is 0.700 s old, more than max_observation_age = 0.5 s (late)'),
    (9.7, 9.8, 'header stamp went backwards by 0.100 s (out of order)'),
    (9.0, 9.8, 'header stamp is 1.000 s old'),
    (11.0, None, 'header stamp is 1.000 s ahead of the node clock: synchronise the clocks '
                 'or set use_header_stamps to false'),
    (float('nan'), None, 'header stamp is not finite (nan)'),
])
def test_stamp_problem(stamp, previous, message):
    problem = stamp_problem(stamp, previous, 10.0, 0.5)
    assert problem == message if message is None else problem.startswith(message)


def test_buffer_refuses_late_and_reordered_frames_and_recovers():
    buffer = ObservationBuffer(['front'], ['j'])
    assert buffer.set_image('front', RGB, 10.0, 9.95, 0.5) is None
    assert 'backwards' in buffer.set_image('front', RGB, 10.1, 9.9, 0.5)
    assert 'late' in buffer.set_image('front', RGB, 10.2, 9.0, 0.5)
    assert buffer.set_image('front', RGB, 10.3, None, 0.5) is None, 'unstamped: arrival only'
    assert buffer.set_image('front', RGB, 10.4, 10.35, 0.5) is None
    # The node's clock jumped back (a restarted simulation): old stamps are forgotten.
    assert buffer.set_image('front', RGB, 1.0, 0.95, 0.5) is None


def peek(scheduler: ChunkScheduler, n: int = 0) -> np.ndarray:
    """Return the planned actions (K, A) of the next steps, as ``next_action`` would; K is 0 when none."""
    plan = scheduler._planned(n)
    if plan is not None:
        return plan.actions
    return np.zeros((0, scheduler._chunks[0][1].shape[1] if scheduler._chunks else 0))


def test_peek_is_read_only_and_matches_the_actions_taken_next():
    scheduler = ChunkScheduler(SchedulerConfig(control_rate_hz=10.0, horizon=4,
                                               blend='temporal_ensemble'))
    assert peek(scheduler).shape[0] == 0
    for offset in (0.0, 1.0):
        request = scheduler.begin_request(0.0)
        chunk = np.arange(8.0).reshape(4, 2) + offset
        scheduler.submit_chunk(request, chunk, 0.0)
        if offset == 0.0:
            scheduler.next_action(0.0)
    plan = peek(scheduler)
    assert plan.shape == (4, 2)  # the second chunk covers steps 1-4, the first steps 0-3
    np.testing.assert_array_equal(peek(scheduler), plan)
    np.testing.assert_allclose(peek(scheduler, 2), plan[:2])
    stats = scheduler.stats
    executed = [scheduler.next_action(0.1 * (i + 1)) for i in range(4)]
    np.testing.assert_allclose(np.stack(executed), plan)
    assert stats['actions_taken'] + 4 == scheduler.stats['actions_taken']


def test_clamp_sequence_limits_every_point_against_the_one_before():
    limits = MotionLimits(lower=np.full(2, -1.0), upper=np.full(2, 1.0),
                          max_velocity=np.full(2, 10.0), max_step=0.1)
    plan = np.array([[0.05, 0.0], [0.5, 0.0], [0.55, 2.0]])
    safe, clamped = limits.clamp_sequence(plan, np.zeros(2), 0.05)
    np.testing.assert_allclose(safe, [[0.05, 0.0], [0.15, 0.0], [0.25, 0.1]])
    assert clamped.tolist() == [0, 1, 2]
    assert np.all(np.abs(np.diff(np.vstack([np.zeros(2), safe]), axis=0)) <= 0.1 + 1e-12)


def test_trajectory_points_are_timed_one_period_apart():
    msg = chunk_to_joint_trajectory(np.zeros((3, 2)), ['a', 'b'], 0.05)
    times = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in msg.points]
    np.testing.assert_allclose(times, [0.05, 0.10, 0.15])


def test_fault_tally_reports_the_last_period_and_keeps_totals():
    tally = FaultTally(('raised', 'late'))
    assert tally.report(0.0, 1.0).level == OK
    tally.add('late', 'slow', 1.0)
    tally.add('raised', 'boom', 1.5)
    report = tally.report(2.0, 1.0)
    assert report.level == ERROR and report.counts == {'raised': 1, 'late': 1}
    assert report.last == 'boom'
    assert tally.report(3.0, 1.0).counts == {'raised': 0, 'late': 0}
    assert tally.totals == {'raised': 1, 'late': 1}


@pytest.mark.parametrize('arguments, message', [
    (['-p', 'control_rate_hz:=fast'],
     "parameter 'control_rate_hz' must be a double in [1.0, 1000.0], but -p "
     "control_rate_hz:=fast gives a string ('fast')"),
    (['-p', 'vla_policy_node:num_threads:=2.0'],
     "parameter 'num_threads' must be an integer in [0, 256], but -p "
     "vla_policy_node:num_threads:=2.0 gives a double ('2.0')"),
    (['-p', 'limits.lower:=[1.0, 2]'],
     "parameter 'limits.lower' must be a double array, but -p limits.lower:=[1.0, 2] gives a "
     'value of no single parameter type'),
    (['-p', 'use_header_stamps:="true"'],
     "parameter 'use_header_stamps' must be a bool, but -p use_header_stamps:=\"true\" gives "
     "a string ('true')"),
])
def test_override_sources_are_type_checked(arguments, message):
    with pytest.raises(ParameterError) as error:
        check_override_sources(['prog', '--ros-args', *arguments], '/vla_policy_node')
    assert str(error.value) == message


def test_override_sources_for_other_nodes_and_good_values_pass(tmp_path):
    other = tmp_path / 'other.yaml'
    other.write_text('/other_node:\n  ros__parameters:\n    control_rate_hz: "x"\n'
                     '/**/vla_policy_node:\n  ros__parameters:\n    limits:\n'
                     '      max_step: 1e-3\n    trajectory_points: 4\n')
    check_override_sources(['--ros-args', '--params-file', str(other), '-p',
                            'other:control_rate_hz:=x', '-p', 'use_header_stamps:=false',
                            '--', '-p', 'not_ros:=x'], '/vla_policy_node')


def test_node_settings_reach_the_loop_and_the_scheduler():
    from test_params import VALUES

    from vla_policy_node.ros.node import loop_settings, scheduler_config
    from vla_policy_node.ros.params import settings_from_values
    settings = settings_from_values({**VALUES, 'chunking.rtc_guidance': 'lerobot', 'chunking.horizon': 0,
                                     'max_action_age': 0.7, 'trajectory_points': 5})
    scheduler = scheduler_config(settings, chunk_size=12)
    assert scheduler.rtc_guidance == 'lerobot' and scheduler.horizon == 12
    loop = loop_settings(settings)
    assert loop.max_action_age == 0.7 and loop.plan_points == 5
    forward = settings_from_values({**VALUES, 'command_interface': 'forward_command', 'trajectory_points': 5})
    assert loop_settings(forward).plan_points == 1
    assert loop_settings(forward).first_point_joints == tuple(range(len(VALUES['joint_names'])))


def server_settings(**changes):
    """Return a policy server's settings for the tiny model on the CPU (two joints, one camera)."""
    from vla_policy_node.ros.server.node import ServerSettings
    return ServerSettings(**{
        'checkpoint': '', 'allow_random_weights': True, 'checkpoint_root': '', 'device': 'cpu', 'dtype': 'float32',
        'cuda_graphs': False, 'torch_compile': False, 'compile_cache_dir': '', 'trace': False, 'num_threads': 1,
        'tiny_chunk_size': 8,
        'tiny_num_steps': 2, 'tiny_seed': 0, 'camera_names': ('front',), 'joint_names': ('a', 'b'),
        'diagnostics_period': 1.0, 'batch_window': 0.0, 'batch_max_size': 6, 'batch_max_queued_mib': 1024,
        'heartbeat_period': 0.1, **changes})


def test_make_policy_compiles_the_batch_sizes_it_is_given_and_the_ready_line_names_them(monkeypatch, simulated_time):
    """
    Compile the server's buckets in make_policy's warm-up, race them, name them in the ready line.

    A stand-in for the compiler records which batch sizes the warm-up built; chunks take simulated time.
    """
    from vla_policy_node.runtime.shape_buckets import batch_buckets
    from vla_policy_node.loading import build_tiny_policy
    from vla_policy_node.ros import policy_loader

    built = set()

    def tiny_with_stand_in_compiler(**kwargs):
        policy = build_tiny_policy(**kwargs)
        runtime, eager = policy.runtime, policy.runtime.sample

        def sample(inputs, noise, guide=None, path=None):
            compiled = (path or runtime.path) == COMPILED
            rows, _ = runtime.bucketed(inputs, noise) if compiled else (inputs, noise)
            if compiled and runtime.build_new_signatures:
                built.add(rows.batch_size)
            simulated_time.sleep(0.001 * rows.batch_size if compiled else 0.01 * inputs.batch_size)
            return eager(inputs, noise, guide, EAGER)
        monkeypatch.setattr(runtime, 'sample', sample)
        return policy
    monkeypatch.setattr(policy_loader, 'build_tiny_policy', tiny_with_stand_in_compiler)
    settings = server_settings(cuda_graphs=True, torch_compile=True)
    lines = []
    policy = policy_loader.make_policy(settings, lines.append, lines.append,
                                       batch_sizes=batch_buckets(settings.batch_max_size))
    assert built == {1, 2, 4, 6} and policy.runtime.batch_sizes == (1, 2, 4, 6)
    assert 'batch buckets, compiled (padded) vs eager: 2 kept' in policy.compile_report
    ready = lines[-1]
    assert ready.startswith('policy ready') and ready.endswith('(compiled); programs built for batch sizes 1, 2, 4, 6')


def test_the_input_checks_only_tighten_at_run_time():
    """max_action_age compares the limits it gives (0 derives one from the horizon); stamps switch on, not off."""
    from test_params import VALUES

    from vla_policy_node.control.ages import ages_loosened, StartAges
    from vla_policy_node.ros.params import settings_from_values

    def settings(**changes):
        return settings_from_values({**VALUES, **changes})
    derived = StartAges(max_observation_age=0.5, max_action_age=0.0, use_header_stamps=True)
    assert ages_loosened(settings(max_action_age=1.0), derived, 0.5) is None       # 1.0 <= 0.5 + 0.5
    assert 'loosening it takes a restart' in ages_loosened(settings(max_action_age=1.1), derived, 0.5)
    assert ages_loosened(settings(max_action_age=0.5), derived, None) is None      # horizon unknown: <= 0.5
    assert ages_loosened(settings(max_action_age=0.6), derived, None) is not None
    explicit = StartAges(max_observation_age=0.5, max_action_age=1.0, use_header_stamps=True)
    assert ages_loosened(settings(max_action_age=0.0), explicit, 0.5) is None      # 0.5 + 0.5 <= 1.0
    assert ages_loosened(settings(max_action_age=0.0), explicit, 0.6) is not None
    assert ages_loosened(settings(max_action_age=0.0), explicit, None) is not None    # a lifecycle node unconfigured
    assert ages_loosened(settings(use_header_stamps=False), derived, 0.5).startswith('use_header_stamps false')
    assert ages_loosened(settings(use_header_stamps=True), StartAges(0.5, 0.0, False), 0.5) is None


def test_a_warm_up_that_runs_out_of_memory_is_the_nodes_start_up_error(monkeypatch):
    """An allocator's RuntimeError in the warm-up ends as 'cannot start: ...', not a traceback."""
    from vla_policy_node.loading import build_tiny_policy
    from vla_policy_node.ros import policy_loader

    def tiny_out_of_memory(**kwargs):
        policy = build_tiny_policy(**kwargs)

        def warmup(observation, *args, **kwargs):
            raise RuntimeError('[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: not enough memory: '
                               'you tried to allocate 137438953472 bytes.\nsecond line')
        policy.warmup = warmup
        return policy
    monkeypatch.setattr(policy_loader, 'build_tiny_policy', tiny_out_of_memory)
    settings = server_settings(cuda_graphs=False, torch_compile=False)
    with pytest.raises(policy_loader.PolicyLoadError, match=r'warm-up .* failed: RuntimeError: .*137438953472 bytes'):
        policy_loader.make_policy(settings, print, print)
