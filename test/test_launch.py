"""
The launch file, checked without the launch packages (they are not on PyPI).

It is parsed with ast: it must declare the documented arguments, start the installed
executable, and every file it names must be installed into share/vla_policy_node by setup.py.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / 'launch' / 'vla_policy.launch.py'


def calls(tree: ast.AST, name: str) -> list[ast.Call]:
    """Every call of ``name(...)`` in the tree."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, 'id', getattr(node.func, 'attr', None)) == name]


def keyword(call: ast.Call, name: str) -> ast.AST:
    return next(k.value for k in call.keywords if k.arg == name)


def test_launch_file_declares_the_documented_arguments():
    tree = ast.parse(LAUNCH.read_text())
    declared = {call.args[0].value for call in calls(tree, 'DeclareLaunchArgument')}
    assert declared == {'config_file', 'namespace', 'device', 'use_sim_time'}
    assert any(f.name == 'generate_launch_description' for f in ast.walk(tree)
               if isinstance(f, ast.FunctionDef))


def test_launch_file_starts_the_installed_node_with_its_installed_config():
    tree = ast.parse(LAUNCH.read_text())
    (node,) = calls(tree, 'Node')
    assert keyword(node, 'package').value == 'vla_policy_node'
    assert keyword(node, 'executable').value == 'vla_policy_node'
    (join,) = calls(tree, 'join')
    parts = [arg.value for arg in join.args[1:]]
    assert parts == ['config', 'default.yaml']
    assert (ROOT / Path(*parts)).is_file()


def test_setup_installs_every_file_the_launch_file_needs():
    setup = ast.parse((ROOT / 'setup.py').read_text())
    text = ast.unparse(setup)
    for pattern in ("glob('launch/*.launch.py')", "glob('config/*.yaml')", "'package.xml'",
                    "f'resource/{PACKAGE}'"):
        assert pattern in text
    assert "f'vla_policy_node = {PACKAGE}.ros.entry:main'" in text
