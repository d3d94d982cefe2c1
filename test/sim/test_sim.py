# SPDX-License-Identifier: Apache-2.0
"""The simulated table-top robot without ROS: kinematics, camera, success check, trajectories, expert."""

import numpy as np
import pytest

from vla_policy_node.sim.planar.arm import PlanarArm
from vla_policy_node.sim.planar.camera import ARM_RGB, TABLE_RGB, TIP_RGB, TopCamera
from vla_policy_node.sim.planar.env import CAMERA_NAME, TouchEnv
from vla_policy_node.sim.planar.expert import ScriptedExpert
from vla_policy_node.sim.planar.task import sample_scene, TaskConfig, touched
from vla_policy_node.sim.rollout import evaluate, success_rate
from vla_policy_node.sim.scene import Block, COLOURS, Scene
from vla_policy_node.sim.trajectory import TrajectoryFollower

ARM = PlanarArm()


def test_forward_kinematics_of_known_poses():
    l1, l2, l3 = ARM.link_lengths
    np.testing.assert_allclose(ARM.tip(np.zeros(3)), [l1 + l2 + l3, 0.0], atol=1e-12)
    np.testing.assert_allclose(ARM.tip(np.array([np.pi / 2, 0.0, 0.0])), [0.0, l1 + l2 + l3], atol=1e-12)
    # Elbow at 90 degrees: the forearm and the wrist point along +y from the elbow at (l1, 0).
    np.testing.assert_allclose(ARM.joint_points(np.array([0.0, np.pi / 2, 0.0])),
                               [[0, 0], [l1, 0], [l1, l2], [l1, l2 + l3]], atol=1e-12)


def test_inverse_kinematics_reaches_every_block_position_within_limits():
    config = TaskConfig()
    for r in np.linspace(config.min_radius, config.max_radius, 7):
        for a in np.linspace(config.min_bearing, config.max_bearing, 9):
            target = np.array([r * np.cos(a), r * np.sin(a)])
            q = ARM.ik(target)
            np.testing.assert_allclose(ARM.tip(q), target, atol=1e-9)
            assert np.all(q >= ARM.lower) and np.all(q <= ARM.upper)


def test_inverse_kinematics_refuses_an_unreachable_target():
    with pytest.raises(ValueError, match='out of reach'):
        ARM.ik(np.array([0.0, 2.0]))


def test_scenes_place_separate_reachable_blocks_away_from_the_start():
    rng = np.random.default_rng(0)
    config = TaskConfig()
    for _ in range(200):
        scene = sample_scene(rng, ARM, config)
        points = [np.asarray(b.position) for b in scene.blocks] + [ARM.tip(np.asarray(scene.start))]
        assert len({b.colour for b in scene.blocks}) == config.num_blocks
        assert scene.target in {b.colour for b in scene.blocks}
        assert scene.instruction == f'touch the {scene.target} block'
        for i in range(len(points)):
            for j in range(i):
                assert np.linalg.norm(points[i] - points[j]) >= config.min_separation
        for b in scene.blocks:
            ARM.ik(np.asarray(b.position))


def to_pixel(camera: TopCamera, point: np.ndarray) -> tuple[int, int]:
    """World (x, y) -> (row, col) of the camera's pixel that contains it."""
    col = (point[0] - camera.x_range[0]) / (camera.x_range[1] - camera.x_range[0]) * camera.width
    row = (camera.y_range[1] - point[1]) / (camera.y_range[1] - camera.y_range[0]) * camera.height
    return int(np.floor(row)), int(np.floor(col))


def scene_of(blocks: dict[str, tuple[float, float]], target: str) -> Scene:
    return Scene(tuple(Block(c, p) for c, p in blocks.items()), target, (np.pi / 2, 0.0, 0.0))


def test_camera_image_shape_colours_and_object_positions():
    camera = TopCamera()
    scene = scene_of({'red': (-0.3, 0.4), 'blue': (0.35, 0.3), 'yellow': (0.0, 0.6)}, 'red')
    q = ARM.ik(np.array([0.2, 0.45]))
    image = camera.render(scene, ARM.joint_points(q), 0.04)
    assert image.shape == (48, 48, 3) and image.dtype == np.uint8
    for block in scene.blocks:
        row, col = to_pixel(camera, np.asarray(block.position))
        assert tuple(image[row, col]) == COLOURS[block.colour], block
    row, col = to_pixel(camera, ARM.tip(q))
    assert tuple(image[row, col]) == TIP_RGB
    row, col = to_pixel(camera, ARM.joint_points(q)[1])      # the elbow lies on the links
    assert tuple(image[row, col]) == ARM_RGB
    assert tuple(image[0, 0]) == TABLE_RGB
    assert not np.any(np.all(image == COLOURS['green'], axis=-1))   # no green block, no green pixel
    # Image rows grow downward: a block further from the base is higher up in the image.
    assert to_pixel(camera, np.array([0.0, 0.6]))[0] < to_pixel(camera, np.array([0.0, 0.3]))[0]


def test_success_only_near_the_named_block():
    scene = scene_of({'red': (-0.3, 0.4), 'blue': (0.35, 0.3)}, 'blue')
    radius = TaskConfig().touch_radius
    assert touched(scene, np.array([0.35, 0.3]))
    assert touched(scene, np.array([0.35 + 0.9 * radius, 0.3]))
    assert not touched(scene, np.array([0.35 + 1.1 * radius, 0.3]))
    assert not touched(scene, np.array([-0.3, 0.4]))       # touching the red block is not the task


def test_env_moves_at_most_the_motor_speed_per_tick():
    env = TouchEnv()
    obs = env.reset(np.random.default_rng(1))
    assert set(obs) == {'images', 'state', 'task'} and obs['images'][CAMERA_NAME].shape == (48, 48, 3)
    start = env.q.copy()
    env.step(start + np.array([1.0, -1.0, 0.05]))
    np.testing.assert_allclose(env.q - start, [0.1, -0.1, 0.05], atol=1e-12)
    with pytest.raises(ValueError, match='finite joint positions'):
        env.step(np.array([np.nan, 0.0, 0.0]))


def test_trajectory_follower_interpolates_in_time():
    follower = TrajectoryFollower(2)
    assert follower.desired(0.0) is None
    follower.set(10.0, np.array([0.0, 0.0]), np.array([0.1, 0.3]), np.array([[1.0, 2.0], [3.0, 2.0]]))
    np.testing.assert_allclose(follower.desired(10.0), [0.0, 0.0])
    np.testing.assert_allclose(follower.desired(10.05), [0.5, 1.0])
    np.testing.assert_allclose(follower.desired(10.2), [2.0, 2.0])
    np.testing.assert_allclose(follower.desired(11.0), [3.0, 2.0])       # holds the last point
    with pytest.raises(ValueError, match='strictly increasing'):
        follower.set(0.0, np.zeros(2), np.array([0.2, 0.1]), np.ones((2, 2)))


def test_scripted_expert_succeeds_at_least_95_percent():
    env = TouchEnv()
    expert = ScriptedExpert(env.arm, env.dt)

    def plan(obs: dict) -> np.ndarray:
        q, chunk = env.q.copy(), []
        for _ in range(10):
            q = expert.action(env.scene, q)
            chunk.append(q)
        return np.asarray(chunk)

    results = evaluate(env, plan, episodes=100, seed=3, execute=5)
    assert success_rate(results) >= 0.95
    assert max(r.steps for r in results) < env.max_steps
