# SPDX-License-Identifier: Apache-2.0
"""
Register a source checkout in an ament prefix, so ``ros2 launch`` and ``ros2 run`` find it.

``pip install -e .`` puts the console scripts next to the interpreter and writes nothing into
the ament index, where ``ros2 launch vla_policy_node ...`` looks the package up. This writes
what ``colcon build --symlink-install`` would: the package marker, ``share/<pkg>/`` (launch,
config and package.xml, each file linked to the checkout so edits count at once) and
``lib/<pkg>/<executable>`` (scripts that run the entry points with this interpreter). The
prefix must then be on ``AMENT_PREFIX_PATH``. Usage:
``python -m vla_policy_node.ament_registration PREFIX``.
"""

from __future__ import annotations

import os
from pathlib import Path
import sys

PACKAGE = 'vla_policy_node'
# The ROS executables (``ros2 run`` / launch), as setup.py installs them: name -> module:function.
EXECUTABLES = {
    'vla_policy_node': f'{PACKAGE}.ros.entry:main',
    'vla_policy_lifecycle_node': f'{PACKAGE}.ros.entry:lifecycle_main',
    'vla_policy_server': f'{PACKAGE}.ros.entry:server_main',
    'vla_policy_sim_robot': f'{PACKAGE}.ros.sim.robot:main',
}
# The user's commands (module:function), also in lib/<pkg> for ros2 run and launch files; setup.py
# copies them to bin/ too, which a workspace's setup puts on PATH (lib/<pkg> is not).
COMMANDS = {
    'vla-policy-bench': f'{PACKAGE}.bench.cli:main',
    'vla-policy-record': f'{PACKAGE}.replay.record:main',
    'vla-policy-replay': f'{PACKAGE}.replay.cli:main',
    'vla-policy-train': f'{PACKAGE}.train.cli:main',
    'vla-policy-sim-eval': f'{PACKAGE}.ros.sim.evaluation:main',
}
INDEX_MARKER = Path('share', 'ament_index', 'resource_index', 'packages', PACKAGE)
SHARED = ('launch', 'config', 'package.xml')
SCRIPT = '''#!{python}
import sys
from {module} import {function}
sys.exit({function}())
'''


def installed_executable(name: str = PACKAGE) -> Path:
    """
    Return where executable ``name`` of this package is installed.

    First ``lib/vla_policy_node/<name>`` of the package's prefix on ``AMENT_PREFIX_PATH`` (a
    colcon install, or the venv ``make install`` registers), then the script next to this
    interpreter (``pip install``). Raises FileNotFoundError when neither exists.
    """
    for prefix in os.environ.get('AMENT_PREFIX_PATH', '').split(os.pathsep):
        path = Path(prefix) / 'lib' / PACKAGE / name
        if prefix and (Path(prefix) / INDEX_MARKER).is_file() and path.is_file():
            return path
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise FileNotFoundError(f'executable {name} of {PACKAGE} is not installed: not in lib/{PACKAGE} of any '
                                f'AMENT_PREFIX_PATH prefix, nor at {path} (run `make install` or colcon build)')
    return path


def register(prefix: Path, source: Path, python: Path) -> None:
    """Write the index marker, link ``share/<pkg>/*`` to ``source``, write ``lib/<pkg>/*`` for ``python``."""
    (prefix / INDEX_MARKER).parent.mkdir(parents=True, exist_ok=True)
    (prefix / INDEX_MARKER).touch()
    share = prefix / 'share' / PACKAGE
    for name in SHARED:     # file by file: ros2 launch does not look inside linked folders
        origin = source / name
        for file in sorted(origin.rglob('*')) if origin.is_dir() else [origin]:
            if file.is_dir():
                continue
            link = share / file.relative_to(source)
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(file.resolve())
    lib = prefix / 'lib' / PACKAGE
    lib.mkdir(parents=True, exist_ok=True)
    for name, entry in {**EXECUTABLES, **COMMANDS}.items():
        module, function = entry.split(':')
        script = lib / name
        script.write_text(SCRIPT.format(python=python, module=module, function=function))
        script.chmod(0o755)


def main(argv: list[str] | None = None) -> int:
    """Register this checkout in the prefix given as the only argument."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f'usage: python -m {PACKAGE}.ament_registration PREFIX', file=sys.stderr)
        return 2
    register(Path(args[0]).absolute(), Path(__file__).resolve().parents[1], Path(sys.executable))
    return 0


if __name__ == '__main__':
    sys.exit(main())
