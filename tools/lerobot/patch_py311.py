#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Make an installed LeRobot (>= 0.5) importable on Python 3.11.

LeRobot >= 0.5 declares ``Requires-Python >= 3.12`` but only uses 3.12 *syntax* (PEP 695) in a handful of
files. This script rewrites those constructs into their 3.11 equivalents, in place, and is idempotent:

* ``type X = expr``                      -> ``X = expr``
* ``class C[T, U](Base):``               -> ``class C(Base, Generic[T, U]):`` (+ module-level TypeVars if missing)
* ``def f[T: Bound](...)``               -> ``def f(...)``                  (+ module-level ``T = TypeVar("T")``)

After patching, every ``.py`` file of the package is compiled with the running interpreter; the script exits
non-zero if any file still fails to compile.

Usage: python patch_py311.py <site-packages>/lerobot
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

TYPE_ALIAS = re.compile(r"^(?P<indent>[ \t]*)type (?P<name>[A-Za-z_]\w*) = ", re.M)
GENERIC_CLASS = re.compile(r"^(?P<indent>[ \t]*)class (?P<name>[A-Za-z_]\w*)\[(?P<params>[^\]]*)\](?P<rest>\(?[^:\n]*\)?):", re.M)
GENERIC_DEF = re.compile(r"^(?P<indent>[ \t]*)def (?P<name>[A-Za-z_]\w*)\[(?P<params>[^\]]*)\]\(", re.M)
MARKER = "# patched for python3.11 by tools/lerobot/patch_py311.py"


def _param_names(params: str) -> list[str]:
    names = []
    for p in params.split(","):
        p = p.strip()
        if p:
            names.append(p.split(":")[0].strip())
    return names


def _ensure_typevars(src: str, names: list[str], before: int) -> tuple[str, int]:
    """Insert ``N = TypeVar("N")`` (if not defined at module level) right before offset ``before``."""
    lines = []
    for n in names:
        if not re.search(rf"^{n} = TypeVar\(", src, re.M):
            lines.append(f'{n} = TypeVar("{n}")  {MARKER}\n')
    if not lines:
        return src, 0
    ins = "".join(lines)
    return src[:before] + ins + src[before:], len(ins)


def _ensure_typing_import(src: str, names: list[str]) -> str:
    need = [n for n in names if not re.search(rf"^from typing import .*\b{n}\b", src, re.M)]
    if not need:
        return src
    line = f"from typing import {', '.join(need)}  {MARKER}\n"
    # after the last `from __future__` import if any, else before the first import
    m = None
    for m in re.finditer(r"^from __future__ import [^\n]*\n", src, re.M):
        pass
    if m is not None:
        return src[: m.end()] + line + src[m.end() :]
    m = re.search(r"^(import|from) ", src, re.M)
    pos = m.start() if m else 0
    return src[:pos] + line + src[pos:]


def patch_source(src: str) -> tuple[str, int]:
    n_changes = 0
    # type aliases
    src, k = TYPE_ALIAS.subn(lambda m: f"{m['indent']}{m['name']} = ", src)
    n_changes += k
    # generic classes
    while True:
        m = GENERIC_CLASS.search(src)
        if not m:
            break
        names = _param_names(m["params"])
        rest = m["rest"]
        generic = f"Generic[{', '.join(names)}]"
        if rest.startswith("(") and rest.endswith(")") and rest.strip("()").strip():
            bases = f"({rest[1:-1]}, {generic})"
        else:
            bases = f"({generic})"
        new = f"{m['indent']}class {m['name']}{bases}:"
        src = src[: m.start()] + new + src[m.end() :]
        if not m["indent"]:
            src, _ = _ensure_typevars(src, names, m.start())
        src = _ensure_typing_import(src, ["Generic", "TypeVar"])
        n_changes += 1
    # generic functions
    while True:
        m = GENERIC_DEF.search(src)
        if not m:
            break
        names = _param_names(m["params"])
        new = f"{m['indent']}def {m['name']}("
        src = src[: m.start()] + new + src[m.end() :]
        if not m["indent"]:
            src, _ = _ensure_typevars(src, names, m.start())
        src = _ensure_typing_import(src, ["TypeVar"])
        n_changes += 1
    return src, n_changes


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    root = Path(sys.argv[1])
    patched = []
    for p in sorted(root.rglob("*.py")):
        src = p.read_text(encoding="utf-8")
        try:
            compile(src, str(p), "exec")
            continue
        except SyntaxError:
            pass
        new, n = patch_source(src)
        if n:
            p.write_text(new, encoding="utf-8")
            patched.append((p.relative_to(root), n))
    for rel, n in patched:
        print(f"patched {rel}: {n} construct(s)")
    bad = []
    for p in sorted(root.rglob("*.py")):
        try:
            compile(p.read_text(encoding="utf-8"), str(p), "exec")
        except SyntaxError as e:
            bad.append(f"{p.relative_to(root)}:{e.lineno}: {e.msg}")
    if bad:
        print("still not valid Python %d.%d syntax:" % sys.version_info[:2])
        print("\n".join("  " + b for b in bad))
        return 1
    print(f"all .py files under {root} compile under Python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
