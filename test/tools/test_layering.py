# SPDX-License-Identifier: Apache-2.0
"""
Architecture guards: which room may import which, torch and ROS where they belong.

The rooms, from the bottom: ``control`` (numpy only: the loop, scheduling, safety), ``model``
(the network), ``runtime`` (running it), ``loading`` (checkpoints -> a Policy), ``server``
(batching), ``sim``, ``dataset`` and ``train``; on top ``ros`` (the only ROS layer), ``replay`` and ``bench``.
``benchmarks/`` beside the package (developers' benchmarks, not installed) may import anything;
nothing installed imports it.
"""

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "vla_policy_node"
ROS = {"rclpy", "sensor_msgs", "std_msgs", "trajectory_msgs", "diagnostic_msgs", "lifecycle_msgs", "std_srvs",
       "builtin_interfaces", "rcl_interfaces", "control_msgs", "vla_policy_interfaces"}
# room -> the package rooms it may import (itself always); rooms not listed may import anything.
MAY_IMPORT = {
    "control": set(),
    "model": {"control"},          # the RTC request type (control/chunking.py)
    "runtime": {"model", "control"},
    "loading": {"model", "runtime", "control"},
    "server": {"control", "runtime"},
    "sim": set(),
    "dataset": set(),              # LeRobotDataset files: pyarrow and PyAV only
    "train": {"model", "runtime", "loading", "control", "sim"},
}


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def room_files(room: str) -> list[Path]:
    return sorted((PKG / room).rglob("*.py"))


def test_rooms_import_only_the_rooms_below_them():
    offenders = []
    for room, allowed in MAY_IMPORT.items():
        for path in room_files(room):
            for module in imported_modules(path):
                parts = module.split(".")
                if parts[0] == "vla_policy_node" and len(parts) > 1 and parts[1] not in allowed | {room}:
                    offenders.append(f"{path.relative_to(PKG)} imports {module}")
    assert offenders == []


def test_ros_only_in_the_ros_layer_and_torch_never_in_control():
    offenders = [f"{p.relative_to(PKG)} imports {m}" for room in MAY_IMPORT for p in room_files(room)
                 for m in imported_modules(p) if m.split(".")[0] in ROS]
    offenders += [f"{p.relative_to(PKG)} imports {m}" for p in room_files("control")
                  for m in imported_modules(p) if m.split(".")[0] == "torch"]
    assert offenders == []


def test_the_installed_package_never_imports_the_developer_benchmarks_or_tests():
    offenders = [f"{p.relative_to(PKG)} imports {m}" for p in PKG.rglob("*.py")
                 for m in imported_modules(p) if m.split(".")[0] in {"benchmarks", "test", "conftest"}]
    assert offenders == []


def test_no_relative_imports():
    """Every import names its room, so a moved module is found by a search."""
    offenders = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                 if any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(ast.parse(p.read_text())))]
    assert offenders == []


def test_message_conversion_does_not_load_torch():
    code = ("import sys; import vla_policy_node.ros.conversions; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    result = subprocess.run([sys.executable, "-c", code], cwd=PKG.parent, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_python_file_carries_the_spdx_license_header():
    root = PKG.parent
    vendored = root / "tools" / "ros2cli"          # ros2/ros2cli's verbs, unchanged (their own headers)
    files = [p for folder in ("vla_policy_node", "benchmarks", "test", "launch", "tools")
             for p in (root / folder).rglob("*.py") if vendored not in p.parents]
    files.append(root / "setup.py")
    missing = [str(p.relative_to(root)) for p in files
               if "SPDX-License-Identifier: Apache-2.0" not in "\n".join(p.read_text().splitlines()[:3])]
    assert missing == []
