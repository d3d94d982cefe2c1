# SPDX-License-Identifier: Apache-2.0
"""Both simulated robots keep the typed contract (``sim.robots.SimEnv``) that training, rollouts and ROS use."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from vla_policy_node.sim.robots import make_env, ROBOTS, SimEnv


@pytest.mark.parametrize('robot', ROBOTS)
def test_each_robot_keeps_the_contract_and_steps_renders_and_closes(robot):
    env = make_env(robot, dt=0.05, max_steps=3)
    assert isinstance(env, SimEnv) and (env.dt, env.max_steps) == (0.05, 3)
    obs = env.reset(np.random.default_rng(0))
    assert obs['state'].shape == (env.num_joints,) and obs['task'] == env.scene.instruction
    image = env.render()
    assert image.dtype == np.uint8 and image.shape[2] == 3
    done = False
    while not done:
        obs, success, done = env.step(env.q)
    assert env.steps <= 3
    env.close()
    assert env.render().shape == image.shape        # a closed robot renders again on demand
    env.close()


@pytest.mark.parametrize('robot', ROBOTS)
def test_an_image_rendered_on_another_thread_is_bit_identical_to_the_main_threads(robot):
    """The real-time robot renders on its physics thread: the trained policies must see the same pixels."""
    env = make_env(robot, dt=0.05, max_steps=3)
    env.reset(np.random.default_rng(4))
    env.step(env.q + 0.1)
    here = env.render()
    env.close()                             # the GL context is current here: released here, made there
    with ThreadPoolExecutor(1) as worker:
        there = worker.submit(env.render).result()
        worker.submit(env.close).result()
    assert there.dtype == here.dtype and np.array_equal(there, here)
    assert np.array_equal(env.render(), here)       # and back on this thread
    env.close()


def test_make_env_names_the_robots_it_knows():
    with pytest.raises(ValueError, match='so101, planar'):
        make_env('ur5')
