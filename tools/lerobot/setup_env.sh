#!/usr/bin/env bash
# Create (or refresh) a CPU-only virtual environment that runs LeRobot's SmolVLA / pi0 / pi0.5 inference paths
# on Python 3.11, for generating and checking the test fixtures in test/fixtures/lerobot<VERSION>/.
#
#   tools/lerobot/setup_env.sh 0.6.1 .venv-lerobot061
#   tools/lerobot/setup_env.sh 0.5.1 .venv-lerobot051
#   tools/lerobot/setup_env.sh 0.4.4 .venv-lerobot044      # transformers 4.57.6; for export_check.py
#
# Rerunnable and idempotent: an existing venv is reused, pip skips what is already satisfied, and the
# Python-3.11 source patch only touches files that do not compile yet.
#
# Why the detours (measured on the project machine, Python 3.11.7, no GPU):
#   * LeRobot >= 0.5 declares Requires-Python >= 3.12 but only uses PEP 695 *syntax* (`type X = ...`,
#     `class C[T]`, `def f[T: B]`); patch_py311.py rewrites those (utils/io_utils.py and processor/pipeline.py
#     are the ones on the policy import path) -> install with --ignore-requires-python.
#   * LeRobot pins torch < 2.12 (0.6.1) / < 2.11 (0.5.1); the only torch here is the local 2.13.0+cpu wheel,
#     so LeRobot is installed with --no-deps and its requirements are installed from a constraints file that
#     pins torch==2.13.0 and otherwise carries LeRobot's own version ranges (read from the wheel's METADATA).
#   * torchvision is imported at module level but never called on these paths; the torchvision wheel for
#     torch 2.13 is CUDA-linked and does not import here -> a stub package (torchvision_stub/) is copied into
#     site-packages; everything in it raises when called (transformers 5's find_spec-based check does see it).
#   * No model hub: run everything with HF_HUB_OFFLINE=1.
# Never install an unpinned torch here (that pulls a multi-GB CUDA build).
set -euo pipefail

VERSION="${1:?usage: $0 LEROBOT_VERSION VENV_DIR}"
DIR="${2:?usage: $0 LEROBOT_VERSION VENV_DIR}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# Only the packages that the smolvla / pi0 / pi05 policy + processor paths import (LeRobot's core
# requirements minus dataset/robot/video/logging ones, plus the `smolvla` and `pi` extras).
case "$VERSION" in
  0.4.*) PKGS=(numpy huggingface-hub safetensors "transformers==4.57.6" draccus einops packaging termcolor tqdm
              requests pillow scipy num2words accelerate opencv-python-headless gymnasium deepdiff jsonlines
              datasets pandas pyarrow imageio diffusers pyserial av) ;;
  0.6.*) PKGS=(numpy huggingface-hub safetensors transformers draccus einops packaging termcolor tqdm requests
              pillow scipy num2words accelerate opencv-python-headless gymnasium
              "datasets==4.8.5" "pandas==2.3.3" "pyarrow==26.0.1" "av==15.1.0" "jsonlines==4.0.0") ;;
  0.5.*) PKGS=(numpy huggingface-hub safetensors transformers draccus einops packaging termcolor tqdm requests
              pillow scipy num2words accelerate opencv-python-headless gymnasium deepdiff
              pandas pyarrow datasets av imageio diffusers pyserial) ;;
  *) echo "unsupported LeRobot version $VERSION (expected 0.4.x, 0.5.x or 0.6.x)" >&2; exit 2 ;;
esac

if [ ! -x "$DIR/bin/python" ]; then
  "$PYTHON" -m venv "$DIR"
fi
PY="$DIR/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
# the local mirror prints one warning per package it does not hold; keep the output readable
pip_quiet() { "${PIP[@]}" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

# 1. torch, pinned (the local CPU wheel)
pip_quiet install -q "torch==${TORCH_VERSION}"

# 2. the LeRobot wheel itself, without its dependencies and ignoring Requires-Python
if [ "$("$PY" -c 'import importlib.metadata as m; print(m.version("lerobot"))' 2>/dev/null || true)" != "$VERSION" ]; then
  pip_quiet install -q --no-deps --ignore-requires-python "lerobot==${VERSION}"
fi

# 3. constraints: torch==2.13.0 + LeRobot's own ranges for its core requirements and the smolvla/pi extras
CONSTRAINTS="$DIR/lerobot-constraints.txt"
"$PY" - "$CONSTRAINTS" "$TORCH_VERSION" <<'EOF'
import importlib.metadata as md, re, sys
try:
    from packaging.requirements import Requirement
    from packaging.markers import Marker
except ImportError:  # fresh venv: use the copy vendored in pip
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.markers import Marker
out, torch_version = sys.argv[1], sys.argv[2]
extras = {"smolvla", "pi", "transformers-dep", "scipy-dep", "accelerate-dep"}
lines = [f"torch=={torch_version}"]
seen = set()
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
EOF

# 4. the requirements the policy paths need, within those constraints
pip_quiet install -q -c "$CONSTRAINTS" "${PKGS[@]}"

# 5. make the installed sources Python-3.11 syntax
"$PY" "$HERE/patch_py311.py" "$SITE/lerobot"

# 6. torchvision stand-in (only if no real torchvision is installed)
if ! "$PY" -c 'import importlib.metadata as m; m.version("torchvision")' 2>/dev/null; then
  rm -rf "$SITE/torchvision"
  cp -r "$HERE/torchvision_stub/torchvision" "$SITE/torchvision"
fi

# 7. smoke test: the three policies and their processors import
"$PY" - <<'EOF'
import importlib, importlib.metadata as md
import torch, transformers
for m in ("lerobot.policies.smolvla.modeling_smolvla", "lerobot.policies.pi0.modeling_pi0",
          "lerobot.policies.pi05.modeling_pi05", "lerobot.policies.factory", "lerobot.processor"):
    importlib.import_module(m)
print("ok: lerobot", md.version("lerobot"), "| transformers", transformers.__version__, "| torch", torch.__version__,
      "| tokenizers", md.version("tokenizers"))
EOF
