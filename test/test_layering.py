# SPDX-License-Identifier: Apache-2.0
"""Architecture guards: the core never imports rclpy; message conversion never imports torch."""

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "vla_policy_node"


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_core_never_imports_ros():
    offenders = [str(p.relative_to(PKG)) for p in (PKG / "core").rglob("*.py")
                 if imported_modules(p) & {"rclpy", "sensor_msgs", "std_msgs", "trajectory_msgs", "diagnostic_msgs"}]
    assert offenders == []


def test_message_conversion_does_not_load_torch():
    code = ("import sys; import vla_policy_node.ros.conversions; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    result = subprocess.run([sys.executable, "-c", code], cwd=PKG.parent, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_python_file_carries_the_spdx_license_header():
    root = PKG.parent
    files = [p for folder in ("vla_policy_node", "test", "launch") for p in (root / folder).rglob("*.py")]
    files.append(root / "setup.py")
    missing = [str(p.relative_to(root)) for p in files
               if "SPDX-License-Identifier: Apache-2.0" not in "\n".join(p.read_text().splitlines()[:3])]
    assert missing == []
