# SPDX-License-Identifier: Apache-2.0
"""Shared test setup: the repository on sys.path, the reference fixtures, a quiet torch."""

import logging
import os
import signal
import sys
from pathlib import Path

from hypothesis import settings
import pytest
from safetensors.torch import load_file
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# Tests live in folders by layer; a few share constants across them (test_replay reads the robot-fit
# settings of test_node_robot_fit), so every folder is importable whichever runs first.
sys.path[1:1] = [str(p) for p in sorted(Path(__file__).resolve().parent.iterdir())
                 if p.is_dir() and p.name not in ("fixtures", "__pycache__")]
REFERENCE = Path(os.environ.get("VLA_REFERENCE_DIR", REPO.parent / "shared" / "reference"))

torch.set_num_threads(1)
# CI (.ci/run) draws the same property-test examples every run, so that its verdict is the code's and a
# rare example found by chance fails a local run (printed, with its seed to replay) instead of a landing.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("VLA_HYPOTHESIS_PROFILE", "default"))
# Started in the background of a shell without job control, a process ignores SIGINT, and so does
# every process it starts: ros2 launch and the nodes the tests stop with SIGINT would not stop.
# A handler (unlike SIG_IGN) is reset by exec, so the processes the tests start get the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# The compiled programs tests build are kept between runs, so a rerun loads them instead of compiling
# (the cache's own tests use folders of their own).
os.environ.setdefault("VLA_POLICY_NODE_CACHE_DIR", str(REPO / ".pytest_cache" / "vla_policy_node"))
# Tests that compile or export outside a ProgramCache (its own fixtures) keep inductor's files there
# too, instead of the system temp folder.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO / ".pytest_cache" / "inductor"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """
    Mark launch_testing's tests ``dds``: its items ignore their module's ``pytestmark``.

    ``make test`` runs the tests not marked ``dds`` on two workers and the DDS ones after,
    one at a time (``ros_harness.next_domain_id`` refuses to run on a worker).
    """
    for item in items:
        if item.get_closest_marker("launch_test") is not None:
            item.add_marker(pytest.mark.dds)


@pytest.fixture(autouse=True)
def project_logs_reach_caplog():
    """
    Let the project's log records reach pytest's caplog.

    launch_testing's pytest plugin (installed with the launch tools) makes every logger created
    after it loads a LaunchLogger that does not propagate, so caplog would see nothing.
    """
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith("vla_policy_node") and isinstance(logger, logging.Logger):
            logger.propagate = True


class SimulatedTime:
    """
    The ``time`` of ``runtime/policy.py`` in tests of the warm-up races: a chunk takes what the test says.

    The races time real chunks; on a busy machine (another test compiling on the other core) a
    real chunk can take longer than the margin a test gives, so those tests time by this clock,
    which moves only by what the test's stand-in chunks ``sleep``.
    """

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def simulated_time(monkeypatch) -> SimulatedTime:
    """Replace the clock the policy's warm-up races read by a ``SimulatedTime``."""
    from vla_policy_node.runtime import policy

    clock = SimulatedTime()
    monkeypatch.setattr(policy, "time", clock)
    return clock


@pytest.fixture
def reference_dir():
    """Folder of one family's LeRobot reference fixture; skips only when the shared folder is absent."""
    def get(family: str) -> Path:
        folder = REFERENCE / family
        if not folder.is_dir():
            pytest.skip(f"reference fixtures not found at {folder} (set VLA_REFERENCE_DIR)")
        return folder
    return get


def fixture_model_inputs(folder: Path, with_state: bool = True):
    """Return the fixture's tensors as fed to the network (``model_input.*``) and all its inputs."""
    from vla_policy_node.model.types import ModelInputs
    inp = load_file(folder / "inputs.safetensors")
    n = sum(k.startswith("model_input.image.") for k in inp)
    return ModelInputs(images=[inp[f"model_input.image.{i}"] for i in range(n)],
                       image_masks=[inp[f"model_input.image_mask.{i}"] for i in range(n)],
                       tokens=inp["batch.observation.language.tokens"],
                       token_mask=inp["batch.observation.language.attention_mask"],
                       state=inp["model_input.state_padded"] if with_state else None), inp


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Return the largest absolute difference of two same-shape tensors."""
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.float() - b.float()).abs().max().item()
