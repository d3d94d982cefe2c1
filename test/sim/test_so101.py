# SPDX-License-Identifier: Apache-2.0
"""The simulated SO-101 in MuJoCo: its model, units, physics, touch check, expert and demonstrations."""

import os
from pathlib import Path
import struct

import numpy as np
import pytest
import yaml

from vla_policy_node.sim.so101 import ASSETS
from vla_policy_node.sim.so101.env import BLOCK_COLOURS, So101TouchEnv
from vla_policy_node.sim.so101.units import JOINT_NAMES, to_lerobot, to_ros
from vla_policy_node.sim.scene import Scene
from vla_policy_node.train.demonstrations import collect, expert_plan

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope='module')
def env():
    environment = So101TouchEnv()
    yield environment
    environment.close()


def test_units_are_what_so101_yaml_tells_the_node():
    params = yaml.safe_load((ROOT / 'config' / 'so101.yaml').read_text())['/**']['ros__parameters']
    assert tuple(params['joint_names']) == JOINT_NAMES
    q = np.array([0.3, -1.2, 1.5, -0.4, 2.0, 0.9])
    node_policy = (q - np.array(params['joint_units']['offset'])) * np.array(params['joint_units']['scale'])
    np.testing.assert_allclose(to_lerobot(q), node_policy, rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(to_ros(to_lerobot(q)), q, atol=1e-12)
    lower, upper = params['limits']['lower'][5], params['limits']['upper'][5]
    np.testing.assert_allclose(to_lerobot(np.array([0, 0, 0, 0, 0, lower]))[5], 0.0, atol=1e-3)   # closed
    np.testing.assert_allclose(to_lerobot(np.array([0, 0, 0, 0, 0, upper]))[5], 100.0, atol=1e-3)  # open


def test_the_so101_trajectories_carry_a_third_of_a_second_of_plan():
    """10 points at 30 Hz: the controller's near points; a node that stops leaves 0.33 s of motion, not a chunk."""
    from vla_policy_node.replay.bag_replay import settings_from_files
    from vla_policy_node.ros.node import loop_settings

    settings = settings_from_files([str(ROOT / 'config' / 'default.yaml'), str(ROOT / 'config' / 'so101.yaml')],
                                   ['allow_random_weights:=true'])
    assert loop_settings(settings).plan_points == 10
    assert settings.trajectory_velocities


def test_the_camera_renders_on_the_calling_thread_unless_the_user_chose(monkeypatch):
    """Mesa's llvmpipe would wake a rasterizer thread on every core for each 64x64 frame, beside the policy."""
    import importlib

    import vla_policy_node.sim.so101 as so101
    monkeypatch.delenv('LP_NUM_THREADS', raising=False)
    importlib.reload(so101)
    assert os.environ['LP_NUM_THREADS'] == '0'
    monkeypatch.setenv('LP_NUM_THREADS', '2')
    importlib.reload(so101)
    assert os.environ['LP_NUM_THREADS'] == '2'


def test_the_model_is_the_so101_with_simplified_meshes_and_fits_the_package_budget():
    triangles = sum(struct.unpack('<I', p.read_bytes()[80:84])[0] for p in (ASSETS / 'meshes').glob('*.stl'))
    assert len(list((ASSETS / 'meshes').glob('*.stl'))) == 13 and 15_000 < triangles < 30_000
    policy = ASSETS.parent / 'touch_policy'
    size = sum(p.stat().st_size for folder in (ASSETS, policy) for p in folder.rglob('*') if p.is_file())
    assert size <= 10 * 2**20
    assert (ASSETS / 'LICENSE').read_text().startswith(' ' * 5) and 'Apache' in (ASSETS / 'LICENSE').read_text()


def test_the_camera_draws_light_copies_of_the_meshes_that_physics_never_sees():
    """A quarter of the triangles for the 30 Hz camera; the same physics to the bit and nearly the same pixels."""
    import mujoco

    light = mujoco.MjModel.from_xml_path(str(ASSETS / 'touch_scene.xml'))
    spec = mujoco.MjSpec.from_file(str(ASSETS / 'touch_scene.xml'))
    visual = [g for g in spec.geoms if g.type == mujoco.mjtGeom.mjGEOM_MESH and g.group == 2]
    collision = [g for g in spec.geoms if g.type == mujoco.mjtGeom.mjGEOM_MESH and g.group == 3]
    assert visual and all(g.meshname.endswith('_visual') for g in visual)
    assert collision and not any(g.meshname.endswith('_visual') for g in collision)
    for g in visual:
        g.meshname = g.meshname.removesuffix('_visual')
    spec.geom('table').size = [1, 1, 0.01]
    full = spec.compile()

    def faces(model, group):
        return sum(int(model.mesh_facenum[model.geom_dataid[g]]) for g in range(model.ngeom)
                   if model.geom_type[g] == mujoco.mjtGeom.mjGEOM_MESH and model.geom_group[g] == group)
    assert faces(light, 2) < 0.3 * faces(full, 2) and faces(light, 3) == faces(full, 3)

    rng = np.random.default_rng(0)
    poses = [rng.uniform(light.actuator_ctrlrange[:6, 0], light.actuator_ctrlrange[:6, 1]) for _ in range(4)]

    def run(model):
        data, images = mujoco.MjData(model), []
        with mujoco.Renderer(model, 64, 64) as renderer:
            for pose in poses:
                data.ctrl[:6] = pose
                for _ in range(150):
                    mujoco.mj_step(model, data)
                renderer.update_scene(data, camera='front')
                images.append(renderer.render().astype(int))
        return data.qpos.copy(), np.array(images)
    (q_light, seen_light), (q_full, seen_full) = run(light), run(full)
    assert np.array_equal(q_light, q_full)
    assert np.abs(seen_light - seen_full).mean() < 2.0


def test_reset_places_three_named_blocks_apart_on_the_table(env):
    rng = np.random.default_rng(0)
    for _ in range(20):
        obs = env.reset(rng)
        scene = env.scene
        assert len(scene.blocks) == 3 and scene.target in [b.colour for b in scene.blocks]
        assert set(b.colour for b in scene.blocks) <= set(BLOCK_COLOURS)
        positions = np.array([b.position for b in scene.blocks])
        gaps = [np.linalg.norm(a - b) for i, a in enumerate(positions) for b in positions[i + 1:]]
        assert min(gaps) >= env.task.min_separation
        assert obs['images']['front'].shape == (64, 64, 3) and obs['images']['front'].dtype == np.uint8
        assert obs['state'].shape == (6,) and obs['task'] == f'touch the {scene.target} block'
        assert not env.success


def test_the_camera_sees_the_blocks(env):
    env.reset(np.random.default_rng(3))
    image = env.render().astype(int)
    red = (image[..., 0] > 150) & (image[..., 1] < 80) & (image[..., 2] < 80)
    blue = (image[..., 2] > 150) & (image[..., 0] < 90)
    colours = {b.colour for b in env.scene.blocks}
    assert red.any() == ('red' in colours) and blue.any() == ('blue' in colours)


def test_position_actuators_follow_with_lag_and_never_teleport(env):
    env.reset(np.random.default_rng(1))
    start = env.q
    target = start.copy()
    target[1] -= 0.5                                   # shoulder_lift half a radian up
    env.step(target)
    one_tick = env.q
    assert 0.02 < start[1] - one_tick[1] < 0.5         # moving, not there after 33 ms
    for _ in range(30):
        env.step(target)
    assert abs(env.q[1] - target[1]) < 0.05            # arrives, up to the servo's sag
    with pytest.raises(ValueError):
        env.step(np.full(6, np.nan))
    with pytest.raises(ValueError):
        env.step(np.zeros(5))


def test_touching_another_block_is_not_success(env):
    env.reset(np.random.default_rng(2))
    other = next(b.colour for b in env.scene.blocks if b.colour != env.scene.target)
    wrong = Scene(blocks=env.scene.blocks, target=other, start=env.scene.start)
    expert = env.expert()
    touched_other = False
    for _ in range(60):
        env.step(expert.action(wrong, env.q))
        env.scene, named = wrong, env.scene
        touched_other = touched_other or env.is_touching()
        env.scene = named
    assert touched_other and not env.success


def touching_pair_by_pair(env) -> bool:
    """Spell the touch check out: a contact between the named block and either jaw."""
    block = env.model.body(env.scene.target).id
    jaws = {env.model.body('gripper').id, env.model.body('moving_jaw_so101_v1').id}
    bodies = env.model.geom_bodyid
    return any(block in pair and pair & jaws for pair in
               ({bodies[c.geom1], bodies[c.geom2]} for c in env.data.contact[:env.data.ncon]))


def test_the_touch_check_finds_exactly_the_named_block_between_a_jaw_and_it(env):
    """Contacts with the table, other blocks and the arm's own links, and jaw-block touches, in both orders."""
    rng = np.random.default_rng(5)
    expert = env.expert()
    seen = set()
    for episode in range(6):
        env.reset(rng)
        other = next(b.colour for b in env.scene.blocks if b.colour != env.scene.target)
        scenes = (env.scene, Scene(blocks=env.scene.blocks, target=other, start=env.scene.start))
        for _ in range(45):
            env.step(expert.action(scenes[episode % 2], env.q))
            for scene in scenes:
                env.scene, named = scene, env.scene
                touching = env.is_touching()
                assert touching == touching_pair_by_pair(env)
                seen.add(touching)
                env.scene = named
    assert seen == {True, False}


def test_scripted_expert_touches_the_named_block_in_at_least_95_percent(env):
    rng = np.random.default_rng(123)
    expert = env.expert()
    wins, steps = 0, []
    for episode in range(40):
        env.reset(rng, keep_pose=episode % 2 == 1)      # half from where the last episode left the arm
        done = False
        while not done:
            _, success, done = env.step(expert.action(env.scene, env.q))
        wins += success
        steps.append(env.steps)
    assert wins >= 38, wins
    assert np.mean(steps) < 40


def test_inverse_kinematics_puts_the_tip_where_the_expert_asks(env):
    """Over the blocks area, from the touch height to the hover height, jaws pitched 75 degrees down."""
    rng = np.random.default_rng(4)
    for _ in range(20):
        point = np.array([rng.uniform(0.14, 0.30), rng.uniform(-0.15, 0.15), rng.uniform(0.02, 0.08)])
        q = env.kinematics.solve(point)
        assert np.all(q >= env.kinematics.lower - 1e-9) and np.all(q <= env.kinematics.upper + 1e-9)
        np.testing.assert_allclose(env.kinematics.tip(q), point, atol=1e-3)


def test_demonstrations_are_in_lerobots_so101_units():
    env = So101TouchEnv()
    demos = collect(env, episodes=2, chunk=10, seed=0, progress=False)
    assert demos.camera == 'front' and demos.images.shape[1:] == (64, 64, 3)
    assert demos.states.shape[1] == 6 and demos.actions.shape[1:] == (10, 6)
    assert np.all(np.abs(demos.states[:, :5]) <= 180.0)          # degrees
    assert np.all((demos.states[:, 5] > -1.0) & (demos.states[:, 5] < 101.0))   # gripper 0..100
    # Each label is the expert's plan from the recorded state, converted like the state.
    state = to_ros(demos.states[0].astype(np.float64))
    env.reset(np.random.default_rng(0))
    scene = env.scene
    plan = expert_plan(env.expert(), scene, state, 10)
    np.testing.assert_allclose(to_lerobot(plan), demos.actions[0], atol=1e-2)
    env.close()
