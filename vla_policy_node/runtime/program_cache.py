# SPDX-License-Identifier: Apache-2.0
"""
On-disk cache of ahead-of-time compiled programs, so that a restart loads instead of compiling.

An entry is a folder named by the digest of its key: what the program was built from
(weights, model structure, schedule, this package's source), the input signature, the
torch version and the CPU/GPU kind. Its ``manifest.json`` repeats the whole key and the
SHA-256 of every file. An entry whose manifest is missing, unreadable, written for
another key (a foreign entry), or whose files do not hash to the manifest (a corrupt or
tampered one) is deleted and rebuilt, never loaded; so is one that another user owns, that
anyone but its owner may write, or whose folder or files are symbolic links (only this user
can have written what is loaded, and the files hashed are the files loaded). Entries are
built in a staging folder
inside the cache and renamed into place, so a crash leaves no half-written entry; a
staging folder whose process died (a compile killed mid-build) is removed at the next build.

On the CPU the entry holds the compiled shared library itself, which is loaded where it
lies: nothing is unpacked into the system temp folder. The compiler's own caches
(``TORCHINDUCTOR_CACHE_DIR``) are pointed into the cache folder too, unless the user set
them elsewhere; so a run leaves nothing under the system temp folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import stat
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

FORMAT = 1
MANIFEST = "manifest.json"
ENV_DIR = "VLA_POLICY_NODE_CACHE_DIR"
log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """``$VLA_POLICY_NODE_CACHE_DIR``, else ``$XDG_CACHE_HOME/vla_policy_node``, else ``~/.cache/vla_policy_node``."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "vla_policy_node"


def device_kind(device: torch.device) -> str:
    """
    Describe what compiled code is specific to: the GPU model and capability, or the CPU's ISA.

    On the CPU: the vector ISA torch dispatches to (AVX512, AVX2, SVE256, ...), the model and
    the feature flags. x86 lists them as ``model name`` and ``flags``; ARM (a Jetson, a
    Graviton) as ``CPU part`` and ``Features``, so an SVE build never loads on a NEON-only CPU.
    """
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"cuda {torch.cuda.get_device_name(device)} sm_{major}{minor} cuda {torch.version.cuda}"
    found: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key in ("model name", "CPU implementer", "CPU part", "flags", "Features"):
                found.setdefault(key, value)
    except OSError:
        pass
    model = " ".join(found[k] for k in ("model name", "CPU implementer", "CPU part") if k in found)
    features = " ".join(sorted(f"{found.get('flags', '')} {found.get('Features', '')}".split()))
    flags = hashlib.sha256(features.encode()).hexdigest()[:16]
    isa = torch.backends.cpu.get_cpu_capability()
    return f"cpu {platform.machine()} {isa} {model or 'unknown model'} flags {flags}"


def compiler_settings() -> dict[str, object]:
    """
    Return what changes generated code besides the model and the CPU, for the cache key.

    Inductor's and ATen's environment settings (``TORCHINDUCTOR_*`` but the cache folder,
    ``ATEN_CPU_CAPABILITY``), the C++ compiler chosen by ``CXX``, and the CPU count, which
    decides whether inductor fixes the thread count in the code.
    """
    names = sorted(k for k in os.environ if k.startswith("TORCHINDUCTOR_") and k != "TORCHINDUCTOR_CACHE_DIR")
    env = {k: os.environ[k] for k in [*names, "ATEN_CPU_CAPABILITY", "CXX"] if k in os.environ}
    return {"env": env, "cpu_count": os.cpu_count()}


# The sources compiled programs are traced from, relative to the package: the network and the
# runtime, and the one control module they import (the RTC request type). A change to the control
# loop, the server or the ROS layer keeps the cache valid; ``test_program_cache`` checks that the
# traced code imports nothing from the package outside these.
TRACED_SOURCES = ("model", "runtime", "control/chunking.py")


def source_digest(package: Optional[Path] = None) -> str:
    """SHA-256 over ``TRACED_SOURCES``: compiled programs are traced from this code."""
    h = hashlib.sha256()
    package = Path(__file__).resolve().parents[1] if package is None else package
    for source in TRACED_SOURCES:
        root = package / source
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            h.update(str(path.relative_to(package)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def tensors_digest(named: Iterable[tuple[str, Tensor]]) -> str:
    """SHA-256 over names, shapes, dtypes and bytes of tensors (the weights a program has built in)."""
    h = hashlib.sha256()
    for name, t in named:
        t = t.detach()
        h.update(f"{name} {tuple(t.shape)} {t.dtype}".encode())
        if t.device.type != "cpu":
            t = t.cpu()
        if t.numel():
            h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def remove_entry(path: Path) -> None:
    """
    Remove a cache entry, whatever stands there (a folder, or a file or link put in its place).

    Two processes may find the same bad entry: it is renamed aside first (one rename wins,
    the other finds nothing to remove), then deleted.
    """
    aside = path.with_name(f"{path.name}.removing-{os.getpid()}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return                          # another process removed it first
    except OSError:
        aside = path
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        aside.unlink(missing_ok=True)


def unsafe(path: Path) -> Optional[str]:
    """Why ``path`` must not hold this user's program (a link, another owner, others may write), or None."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return f"{path.name} is a symbolic link"
    if os.name != "posix":          # no owners or write bits to check (Windows): links only
        return None
    if info.st_uid != os.getuid():
        return f"{path.name} belongs to another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path.name} may be written by other users (mode {stat.filemode(info.st_mode)})"
    return None


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (it may belong to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LoadedProgram:
    """A compiled shared library called like the module it was exported from (flat tensors in, pytree out)."""

    def __init__(self, runner: object) -> None:
        self.runner = runner
        _, out_spec = runner.get_call_spec()              # (input spec, output spec)
        self.out_spec = pytree.treespec_loads(out_spec)     # decoded once, not at every call

    def __call__(self, *args: object) -> object:
        flat = [x for x in pytree.tree_leaves(args) if isinstance(x, Tensor)]
        return pytree.tree_unflatten(self.runner.run(flat), self.out_spec)


def point_compiler_caches_at(root: Path) -> None:
    """
    Keep inductor's caches in ``root`` instead of the system temp folder, unless the user chose a folder.

    Inductor's precompiled headers ignore ``TORCHINDUCTOR_CACHE_DIR`` (a module constant
    fixed at import under the temp folder), so they are redirected too: into ``root``, or
    into the folder the user chose.
    """
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    temp = Path(tempfile.gettempdir()).resolve()
    user_chose = current is not None and not Path(current).resolve().is_relative_to(temp)
    folder = Path(current).resolve() if user_chose else root.resolve() / "inductor"
    if not user_chose:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)     # before inductor is imported
    from torch._inductor import codecache
    if not user_chose:
        from torch._inductor.utils import clear_caches
        clear_caches()
    if Path(getattr(codecache, "_HEADER_DIR", folder)).resolve().is_relative_to(temp):
        codecache._HEADER_DIR = str(folder / "precompiled_headers")
        codecache._HEADER_LOCK_DIR = str(folder / "precompiled_headers" / "locks")


def compiler_problem() -> Optional[str]:
    """
    Say why AOTInductor cannot build here (no working C++ compiler), or None.

    Checked before a build: without it, export and lowering run for half a minute per
    program before the compiler call fails.
    """
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
    except ImportError:                          # another torch: its build will say
        return None
    try:
        get_cpp_compiler()
    except Exception as error:  # noqa: B902 - InvalidCxxCompiler, or whatever a broken toolchain raises
        return f"{type(error).__name__}: {error}"
    return None


@dataclass
class CacheStats:
    """What the cache did in this process: the node logs it, the tests assert it."""

    loaded: int = 0       # entries loaded from disk (no compilation)
    built: int = 0        # programs compiled (absent entries, and rebuilt ones)
    rebuilt: int = 0      # entries found corrupt or foreign, deleted and rebuilt


class ProgramCache:
    """Compiled programs on disk under ``root``, keyed by what they were built from."""

    def __init__(self, root: Optional[Path] = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        self.stats = CacheStats()

    def entry(self, key: dict) -> Path:
        return self.root / "programs" / key_digest(key)[:32]

    def load_or_build(self, key: dict, build: Callable[[Path], None], device: torch.device) -> Callable:
        """
        Load the program of ``key``, or build it with ``build(package_path)`` and store it.

        ``build`` writes an AOTInductor package (``.pt2``) to the path it is given.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        folder = self.entry(key)
        if folder.exists() or folder.is_symlink():
            problem = self._verify(folder, key)
            if problem is None:
                try:
                    program = self._load(folder, device)
                    self.stats.loaded += 1
                    log.info("compiled program loaded from %s", folder)
                    return program
                except RuntimeError as error:        # a library that verifies but does not load (ABI)
                    problem = f"it does not load: {error}"
            log.warning("compile cache entry %s rebuilt: %s", folder, problem)
            remove_entry(folder)
            self.stats.rebuilt += 1
        self.prune_staging()
        self._build(folder, key, build, device)
        self.stats.built += 1
        return self._load(folder, device)

    def prune_staging(self) -> list[Path]:
        """Remove the staging (and half-removed) folders of processes that no longer run; returns them."""
        removed = []
        leftovers = [*self.root.glob("staging-*"), *self.root.glob("programs/*.removing-*")]
        for staging in leftovers:
            pid = staging.name.rsplit("-", 1)[1] if ".removing-" in staging.name else staging.name.split("-")[1]
            if pid.isdigit() and process_alive(int(pid)):
                continue                          # another process is building (or removing) there now
            if staging.is_dir() and not staging.is_symlink():
                shutil.rmtree(staging, ignore_errors=True)
            else:
                staging.unlink(missing_ok=True)
            removed.append(staging)
        if removed:
            log.info("compile cache: removed %d staging folder(s) left by killed builds", len(removed))
        return removed

    def _build(self, folder: Path, key: dict, build: Callable[[Path], None], device: torch.device) -> None:
        point_compiler_caches_at(self.root)           # only here: loading needs no compiler (nor its import)
        problem = compiler_problem()
        if problem is not None:
            raise RuntimeError(f"cannot compile: {problem}")
        staging = Path(tempfile.mkdtemp(prefix=f"staging-{os.getpid()}-", dir=self.root))
        try:
            package = staging / "program.pt2"
            build(package)
            if device.type == "cpu":              # keep the library alone: loaded where it lies
                with zipfile.ZipFile(package) as archive:
                    libraries = [n for n in archive.namelist() if n.endswith(".so")]
                    if len(libraries) != 1:
                        raise RuntimeError(f"expected one shared library in the package, found {libraries}")
                    with archive.open(libraries[0]) as src, open(staging / "program.so", "wb") as dst:
                        shutil.copyfileobj(src, dst)
                package.unlink()
            for path in staging.iterdir():        # whatever the umask: only this user may write them
                path.chmod(0o600)
            files = {p.name: file_digest(p) for p in sorted(staging.iterdir())}
            manifest = {"format": FORMAT, "key": key, "files": files}
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            (staging / MANIFEST).chmod(0o600)
            staging.chmod(0o700)
            folder.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(staging, folder)
            except OSError:                       # another process stored it first: keep theirs
                if self._verify(folder, key) is not None:
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    @staticmethod
    def _verify(folder: Path, key: dict) -> Optional[str]:
        """Return why the entry must not be loaded, or None."""
        try:
            problem = unsafe(folder) or unsafe(folder / MANIFEST)
        except OSError as error:
            return f"it cannot be inspected ({error})"
        if problem is not None:
            return problem
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
        except (OSError, ValueError) as error:
            return f"no readable manifest ({error})"
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            return "manifest of another format"
        if manifest.get("key") != json.loads(json.dumps(key)):
            return "foreign entry: its manifest was written for another key"
        files = manifest.get("files")
        if not isinstance(files, dict) or not files:
            return "manifest lists no files"
        present = {p.name for p in folder.iterdir()} - {MANIFEST}
        if present != set(files):
            return f"files {sorted(present)} differ from the manifest's {sorted(files)}"
        for name, digest in files.items():
            try:
                problem = unsafe(folder / name)
                if problem is not None:
                    return problem
                if not stat.S_ISREG(os.lstat(folder / name).st_mode):
                    return f"{name} is not a regular file"
                if file_digest(folder / name) != digest:
                    return f"{name} does not match its SHA-256 in the manifest (corrupt or tampered)"
            except OSError as error:
                return f"{name} cannot be read ({error})"
        return None

    @staticmethod
    def _load(folder: Path, device: torch.device) -> Callable:
        if (folder / "program.so").exists():
            return LoadedProgram(torch._C._aoti.AOTIModelContainerRunnerCpu(str(folder / "program.so"), 1))
        index = device.index if device.type == "cuda" and device.index is not None else -1
        return torch._inductor.aoti_load_package(str(folder / "program.pt2"), device_index=index)
