# SPDX-License-Identifier: Apache-2.0
"""
The launch file and its installation, checked without the launch packages (always run).

It is parsed with ast: the documented arguments are declared, both executables exist, and
every file it names is installed into share/vla_policy_node by setup.py; ros2 launch itself is
exercised by test_launch_cli.py and test_launch_dds.py where the launch tools are installed.
"""

import ast
import importlib.util
from pathlib import Path

import launch_setup
import pytest

from vla_policy_node.ament_registration import COMMANDS, EXECUTABLES

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / 'launch' / 'vla_policy.launch.py'
ARGUMENTS = {'config_file', 'params_files', 'namespace', 'lifecycle', 'autostart', 'log_level', 'record', 'checkpoint',
             'device', 'use_sim_time'}


def calls(tree: ast.AST, name: str) -> list[ast.Call]:
    """Every call of ``name(...)`` in the tree."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, 'id', getattr(node.func, 'attr', None)) == name]


def test_launch_file_declares_the_documented_arguments():
    tree = ast.parse(LAUNCH.read_text())
    overrides = next(node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                     and getattr(node.targets[0], 'id', '') == 'OVERRIDES')
    declared = {call.args[0].value for call in calls(tree, 'DeclareLaunchArgument')
                if isinstance(call.args[0], ast.Constant)}
    declared |= {key.value for key in overrides.keys}
    assert declared == ARGUMENTS
    readme = (ROOT / 'README.md').read_text()
    assert all(f'`{name}`' in readme for name in ARGUMENTS)


def test_launch_file_starts_installed_executables_with_the_installed_config():
    tree = ast.parse(LAUNCH.read_text())
    executables = {kw.value.value for call in calls(tree, 'LifecycleNode') + calls(tree, 'Node')
                   for kw in call.keywords if kw.arg == 'executable'}
    assert executables == {'vla_policy_node', 'vla_policy_lifecycle_node', 'vla-policy-record'}
    assert executables <= set(EXECUTABLES) | set(COMMANDS)
    (join,) = [call for call in calls(tree, 'join') if getattr(call.args[-1], 'value', None) == 'default.yaml']
    parts = [arg.value for arg in join.args[1:]]
    assert parts == ['config', 'default.yaml']
    assert (ROOT / Path(*parts)).is_file()


def test_setup_installs_every_file_and_executable_the_launch_file_needs():
    text = ast.unparse(ast.parse((ROOT / 'setup.py').read_text()))
    for pattern in ("glob('launch/*.launch.py')", "glob('config/*.yaml')", "'package.xml'",
                    "f'resource/{PACKAGE}'", "'LICENSE'"):
        assert pattern in text
    assert "f'{name} = {entry}' for name, entry in {**EXECUTABLES, **COMMANDS}.items()" in text
    for entry in EXECUTABLES.values():
        module, function = entry.split(':')
        source = ROOT / Path(*module.split('.')).with_suffix('.py')
        assert f'def {function}(' in source.read_text(), entry


def test_launch_tests_skip_with_the_reason_without_the_tools_and_the_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name: None)
    monkeypatch.setattr(launch_setup, 'LAUNCH_DIR', tmp_path / 'ros2-launch')
    with pytest.raises(pytest.skip.Exception, match='ros2-launch not found: `make setup`'):
        launch_setup.require_launch_tools()
    (tmp_path / 'ros2-launch').mkdir()
    with pytest.raises(AssertionError, match='run `make setup`'):
        launch_setup.require_launch_tools()
