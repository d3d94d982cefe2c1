# SPDX-License-Identifier: Apache-2.0
"""ament_flake8 over every Python file of the package, its tests and its launch file."""

from pathlib import Path

from ament_flake8.main import main_with_errors
import pytest

ROOT = Path(__file__).resolve().parents[2]
PATHS = ['vla_policy_node', 'benchmarks', 'launch', 'setup.py', 'test']


@pytest.mark.flake8
@pytest.mark.linter
def test_flake8():
    rc, errors = main_with_errors(
        argv=['--linelength', '120'] + [str(ROOT / path) for path in PATHS])
    assert rc == 0, f'Found {len(errors)} code style errors / warnings:\n' + '\n'.join(errors)
