#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Create (or refresh) a CPU-only LeRobot 0.4.4 virtual environment (transformers 4.57.6) for
# tools/lerobot/export_check.py, the check that vla-policy-train's LeRobot 0.4 export loads there.
#
#   tools/lerobot/export_setup_lerobot044.sh .venv-lerobot044
#
# The same procedure as tools/lerobot/setup_env.sh (which covers LeRobot 0.5.x / 0.6.x), for 0.4.4:
#   * torch is pinned to the local 2.13.0+cpu wheel (LeRobot 0.4.4 asks for torch < 2.8); so LeRobot is
#     installed with --no-deps and its requirements come from a constraints file that pins torch==2.13.0 and
#     otherwise carries LeRobot's own ranges (read from the wheel's METADATA), with transformers==4.57.6.
#   * LeRobot 0.4.4 runs on Python 3.11 as it is (no source patch needed).
#   * torchvision is imported at module level but not called on the SmolVLA inference path: the stand-in
#     package tools/lerobot/torchvision_stub is copied into site-packages (no dist-info).
#   * No model hub: run everything with HF_HUB_OFFLINE=1.
# Never install an unpinned torch here (that pulls a multi-GB CUDA build).
set -euo pipefail

DIR="${1:?usage: $0 VENV_DIR}"
VERSION="0.4.4"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
TRANSFORMERS_VERSION="4.57.6"
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

PKGS=(numpy huggingface-hub safetensors "transformers==${TRANSFORMERS_VERSION}" draccus einops packaging termcolor
      tqdm requests pillow scipy num2words accelerate opencv-python-headless gymnasium deepdiff jsonlines
      datasets pandas pyarrow imageio diffusers pyserial av)

if [ ! -x "$DIR/bin/python" ]; then
  "$PYTHON" -m venv "$DIR"
fi
PY="$DIR/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
pip_quiet() { "${PIP[@]}" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

# 1. torch, pinned (the local CPU wheel)
pip_quiet install -q "torch==${TORCH_VERSION}"

# 2. the LeRobot wheel itself, without its dependencies
if [ "$("$PY" -c 'import importlib.metadata as m; print(m.version("lerobot"))' 2>/dev/null || true)" != "$VERSION" ]; then
  pip_quiet install -q --no-deps "lerobot==${VERSION}"
fi

# 3. constraints: torch, transformers pinned + LeRobot's own ranges for its core requirements and the smolvla extra
CONSTRAINTS="$DIR/lerobot-constraints.txt"
"$PY" - "$CONSTRAINTS" "$TORCH_VERSION" "$TRANSFORMERS_VERSION" <<'PYEOF'
import importlib.metadata as md, re, sys
try:
    from packaging.requirements import Requirement
    from packaging.markers import Marker
except ImportError:  # fresh venv: use the copy vendored in pip
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.markers import Marker
out, torch_version, transformers_version = sys.argv[1:4]
extras = {"smolvla", "transformers-dep", "scipy-dep", "accelerate-dep"}
lines = [f"torch=={torch_version}", f"transformers=={transformers_version}"]
seen = {"transformers"}
for r in md.requires("lerobot") or []:
    req = Requirement(r)
    name = req.name.lower()
    if name in {"torch", "torchvision", "torchcodec", "lerobot"} or not str(req.specifier):
        continue
    m = str(req.marker) if req.marker else ""
    ex = re.findall(r'extra == "([^"]+)"', m)
    if ex and not set(ex) & extras:
        continue
    env_marker = re.sub(r'\s*(and|or)?\s*extra == "[^"]+"', "", m).strip()
    env_marker = re.sub(r"^\((.*)\)$", r"\1", env_marker).strip()
    if env_marker and not Marker(env_marker).evaluate():
        continue
    if name in seen:
        continue
    seen.add(name)
    lines.append(f"{name}{req.specifier}")
open(out, "w").write("\n".join(lines) + "\n")
print(f"wrote {out}: " + ", ".join(lines))
PYEOF

# 4. the requirements the SmolVLA policy path needs, within those constraints
pip_quiet install -q -c "$CONSTRAINTS" "${PKGS[@]}"

# 5. torchvision stand-in (only if no real torchvision is installed)
if ! "$PY" -c 'import importlib.metadata as m; m.version("torchvision")' 2>/dev/null; then
  rm -rf "$SITE/torchvision"
  cp -r "$HERE/torchvision_stub/torchvision" "$SITE/torchvision"
fi

# 6. smoke test: the policy and its processors import
"$PY" - <<'PYEOF'
import importlib, importlib.metadata as md
import torch, transformers
for m in ("lerobot.policies.smolvla.modeling_smolvla", "lerobot.policies.factory", "lerobot.processor"):
    importlib.import_module(m)
print("ok: lerobot", md.version("lerobot"), "| transformers", transformers.__version__, "| torch", torch.__version__,
      "| tokenizers", md.version("tokenizers"))
PYEOF
