# SPDX-License-Identifier: Apache-2.0
"""The on-disk cache of compiled programs: reused on a second start, bad entries rebuilt, no temp files."""

import ast
import json
import os
import re
from pathlib import Path
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from vla_policy_node.runtime.engine import COMPILED, EAGER, RuntimeConfig
from vla_policy_node.runtime.compiled import aot_compile
from vla_policy_node.runtime.program_cache import (default_cache_dir, MANIFEST, TRACED_SOURCES,
                                                   point_compiler_caches_at, ProgramCache, source_digest)
from vla_policy_node.loading import build_tiny_policy

CPU = torch.device("cpu")


class Small(torch.nn.Module):
    """A program that compiles in seconds: the cache logic does not depend on its size."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, x, pair):
        return {"y": torch.tanh(self.linear(x)), "sum": pair[0] + pair[1]}


ARGS = (torch.randn(2, 8), (torch.ones(3), torch.full((3,), 2.0)))
KEY = {"program": "small", "weights": "w0"}


def build(path: Path) -> None:
    with torch.no_grad():
        aot_compile(Small().eval(), ARGS, path)


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """Compile the ``KEY`` program once for the module: the builds of the cache tests copy it."""
    path = tmp_path_factory.mktemp("package") / "program.pt2"
    torch.manual_seed(0)
    point_compiler_caches_at(tmp_path_factory.mktemp("compiler"))    # as a ProgramCache build does
    build(path)
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory, package):
    """Build a cache folder holding the one entry of ``KEY``, once for the module."""
    root = tmp_path_factory.mktemp("programs")
    cache = ProgramCache(root)
    program = cache.load_or_build(KEY, lambda path: shutil.copyfile(package, path), CPU)
    assert (cache.stats.built, cache.stats.loaded) == (1, 0)
    out = program(*ARGS)
    assert set(out) == {"y", "sum"} and torch.equal(out["sum"], torch.full((3,), 3.0))
    return root, out


def test_a_second_start_loads_instead_of_compiling(store):
    root, first = store
    cache = ProgramCache(root)            # a new process sees only the folder
    program = cache.load_or_build(KEY, lambda path: pytest.fail("compiled again"), CPU)
    assert (cache.stats.loaded, cache.stats.built, cache.stats.rebuilt) == (1, 0, 0)
    out = program(*ARGS)
    assert torch.equal(out["y"], first["y"]) and torch.equal(out["sum"], first["sum"])


def tamper(entry: Path) -> None:
    library = entry / "program.so"
    data = bytearray(library.read_bytes())
    data[len(data) // 2] ^= 0xFF
    library.write_bytes(bytes(data))


def foreign(entry: Path) -> None:
    manifest = json.loads((entry / MANIFEST).read_text())
    manifest["key"]["weights"] = "other weights"
    (entry / MANIFEST).write_text(json.dumps(manifest))


def no_manifest(entry: Path) -> None:
    (entry / MANIFEST).unlink()


def library_replaced_by_a_folder(entry: Path) -> None:
    (entry / "program.so").unlink()
    (entry / "program.so").mkdir()


def entry_replaced_by_a_file(entry: Path) -> None:
    subprocess.run(["rm", "-r", str(entry)], check=True)
    entry.write_bytes(b"not a folder")


def library_linked_elsewhere(entry: Path) -> None:
    """Put a link in the library's place: the file hashed need not be the file loaded."""
    outside = entry.parent.parent / "elsewhere.so"
    (entry / "program.so").rename(outside)
    (entry / "program.so").symlink_to(outside)


def entry_linked_elsewhere(entry: Path) -> None:
    outside = entry.parent.parent / "elsewhere"
    entry.rename(outside)
    entry.symlink_to(outside, target_is_directory=True)


def writable_by_others(entry: Path) -> None:
    (entry / "program.so").chmod(0o666)


@pytest.mark.parametrize("damage", [tamper, foreign, no_manifest, library_replaced_by_a_folder,
                                    entry_replaced_by_a_file, library_linked_elsewhere,
                                    entry_linked_elsewhere, writable_by_others])
def test_a_corrupt_or_foreign_entry_is_rebuilt_not_loaded(store, package, tmp_path, damage):
    root, first = store
    copy = tmp_path / "cache"
    subprocess.run(["cp", "-r", str(root), str(copy)], check=True)
    cache = ProgramCache(copy)
    damage(cache.entry(KEY))
    built = []

    def rebuild(path: Path) -> None:
        built.append(path)
        shutil.copyfile(package, path)
    out = cache.load_or_build(KEY, rebuild, CPU)(*ARGS)
    assert len(built) == 1 and (cache.stats.rebuilt, cache.stats.built, cache.stats.loaded) == (1, 1, 0)
    assert torch.equal(out["sum"], first["sum"]) and out["y"].shape == first["y"].shape
    again = ProgramCache(copy)
    again.load_or_build(KEY, lambda path: pytest.fail("the rebuilt entry was not kept"), CPU)
    assert again.stats.loaded == 1
    entry = cache.entry(KEY)
    assert not entry.is_symlink() and all(not p.is_symlink() for p in entry.iterdir())
    assert all(p.stat().st_mode & 0o077 == 0 for p in [entry, *entry.iterdir()]), 'only this user may read or write'
    assert [p.name for p in entry.parent.iterdir()] == [entry.name], 'nothing left beside the entry'


def test_two_processes_removing_the_same_bad_entry_both_go_on(tmp_path):
    from vla_policy_node.runtime.program_cache import remove_entry

    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "program.so").write_bytes(b"x")
    remove_entry(entry)
    remove_entry(entry)                    # the second finds nothing: no error
    assert list(tmp_path.iterdir()) == []
    half_removed = tmp_path / "programs" / f"{'0' * 32}.removing-{2 ** 22 + 1}"   # a pid above pid_max
    half_removed.mkdir(parents=True)
    (half_removed / "program.so").write_bytes(b"x")
    assert ProgramCache(tmp_path).prune_staging() == [half_removed]      # a process killed mid-removal
    assert list((tmp_path / "programs").iterdir()) == []


def test_the_cpu_kind_names_the_isa_torch_runs():
    from vla_policy_node.runtime.program_cache import device_kind

    kind = device_kind(CPU)
    assert torch.backends.cpu.get_cpu_capability() in kind and " flags " in kind


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("VLA_POLICY_NODE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "vla_policy_node"
    monkeypatch.setenv("VLA_POLICY_NODE_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"


def test_compiling_and_loading_leave_nothing_in_the_temp_folder(tmp_path):
    """A fresh process compiles, a second one loads; the temp folder both used stays empty."""
    temp, cache = tmp_path / "temp", tmp_path / "cache"
    temp.mkdir()
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]
        from test_program_cache import ARGS, KEY, build
        from vla_policy_node.runtime.program_cache import ProgramCache
        cache = ProgramCache({str(cache)!r})
        cache.load_or_build(KEY, build, torch.device("cpu"))(*ARGS)
        print(cache.stats.built, cache.stats.loaded)
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    env.update(TMPDIR=str(temp), PYTHONPATH=os.pathsep.join(sys.path))
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    assert [r.stdout.split() for r in runs] == [["1", "0"], ["0", "1"]]
    assert sorted(os.listdir(temp)) == []
    assert (cache / "inductor").is_dir()         # the compiler's own cache went to the cache folder


def test_without_a_compiler_the_build_fails_at_once_and_leaves_nothing(tmp_path, monkeypatch):
    """No working C++ compiler: refused before exporting (half a minute a program), nothing stored."""
    import torch._inductor.config as inductor_config
    monkeypatch.setattr(inductor_config.cpp, "cxx", (None, str(tmp_path / "no-such-compiler")))
    cache, built = ProgramCache(tmp_path / "cache"), []
    with pytest.raises(RuntimeError, match="cannot compile: InvalidCxxCompiler.*no-such-compiler"):
        cache.load_or_build(KEY, built.append, CPU)
    assert built == [] and cache.stats.built == 0
    assert not (tmp_path / "cache" / "programs").exists() and not list((tmp_path / "cache").glob("staging-*"))


def test_a_build_killed_midway_leaves_no_staging_folder_behind(tmp_path):
    """A process killed while compiling leaves its staging folder; the next build removes it, not a live one's."""
    script = textwrap.dedent(f"""
        import time, torch
        from vla_policy_node.runtime.program_cache import ProgramCache
        def build(path):
            print(path.parent.name, flush=True)
            time.sleep(600)
        ProgramCache({str(tmp_path)!r}).load_or_build({{"k": 1}}, build, torch.device("cpu"))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    building = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    try:
        killed = tmp_path / building.stdout.readline().strip()
    finally:
        building.kill()
        building.wait(timeout=30)
    assert killed.name.startswith(f"staging-{building.pid}-") and killed.is_dir()
    live = tmp_path / f"staging-{os.getpid()}-building"        # this process, as if compiling now
    live.mkdir()

    def build(path: Path) -> None:
        assert not killed.exists() and live.is_dir()
        raise RuntimeError("checked")

    with pytest.raises(RuntimeError, match="checked"):
        ProgramCache(tmp_path).load_or_build({"k": 2}, build, CPU)
    assert sorted(p.name for p in tmp_path.glob("staging-*")) == [live.name]


def timed_compile(monkeypatch, clock, seconds) -> object:
    """
    Return a tiny policy whose chunks run eager and take ``seconds(compiled, rows)`` by ``clock``: a stand-in for speed.

    rows: the batch the call would run, padded up to the runtime's batch bucket when compiled. The batch
    sizes "compiled" (called while the runtime may build) are listed in ``policy.built_batches``.
    """
    policy = build_tiny_policy(("front",), chunk_size=8, num_steps=2)
    runtime = policy.runtime
    eager = runtime.sample
    policy.built_batches = []

    def timed(inputs, noise, guide=None, path=None):
        compiled = (path or runtime.path) == COMPILED
        rows = inputs.batch_size
        if compiled:
            rows = min([b for b in runtime.batch_sizes if b >= rows] or [rows])
            if runtime.build_new_signatures:
                policy.built_batches.append(rows)
        clock.sleep(seconds(compiled, rows))
        return eager(inputs, noise, guide, EAGER)
    monkeypatch.setattr(runtime, "sample", timed)
    runtime.path = COMPILED
    return policy


def test_a_compiled_policy_that_loses_the_warm_up_race_runs_eager(monkeypatch, simulated_time):
    """Never slower than eager: compiled code measured slower in the warm-up is refused, with the reason."""
    policy = timed_compile(monkeypatch, simulated_time, lambda compiled, rows: 0.05 if compiled else 0.0)
    runtime = policy.runtime
    runtime.batch_sizes = (1, 2, 4, 8)
    policy.warmup(policy.dummy_observation(), iterations=1, race_rounds=2)
    assert runtime.torch_compile is False
    assert set(policy.built_batches) == {1}             # no larger batch size is compiled for a model that lost
    assert "refused" in policy.compile_report and "eager" in policy.compile_report
    assert np.isfinite(policy.predict_action_chunk(policy.dummy_observation())).all()


@pytest.mark.parametrize("compiled_s, kept_compiled, threads", [(0.04, False, 1), (0.002, True, None)])
def test_compiled_code_races_the_best_eager_thread_count(monkeypatch, simulated_time, compiled_s, kept_compiled,
                                                         threads):
    """
    Eager is 60 ms with 2 threads but 20 ms with 1: compiled code at 40 ms loses to the eager that won its race.

    The times are the simulated clock's: each call also runs the real eager chunk, whose own time would vary
    with the load (another test compiling on the other core made the 2 ms compiled chunk lose here).
    """
    from vla_policy_node.runtime.policy import cpu_threads

    def seconds(compiled, rows):
        return compiled_s if compiled else 0.02 if torch.get_num_threads() == 1 else 0.06
    policy = timed_compile(monkeypatch, simulated_time, seconds)
    runtime = policy.runtime
    with cpu_threads(2):
        policy.warmup(policy.dummy_observation(), iterations=1, race_rounds=2)
    assert (runtime.torch_compile, policy.threads) == (kept_compiled, threads)
    assert "eager with 1 thread(s)" in policy.compile_report
    assert "CPU threads: 1 of 2 kept" in policy.threads_report
    assert ("compiled code won" in policy.threads_report) == kept_compiled


def test_a_batch_bucket_whose_padded_compiled_batch_loses_to_eager_is_dropped_with_the_larger(
        monkeypatch, simulated_time):
    """
    Drop a losing batch bucket and every larger one.

    Compiled batches of 1, 2, 4 and 8 rows take 10, 20, 40 and 400 ms, eager 50 ms per real row: 2 rows
    (20 vs 100 ms) and 3 rows padded to 4 (40 vs 150) stay compiled; 5 rows padded to 8 (400 vs 250) lose,
    so 8 and 16 are dropped (batches of 5 rows or more run eager).
    """
    compiled_s = {1: 0.01, 2: 0.02, 4: 0.04, 8: 0.4, 16: 0.8}
    policy = timed_compile(monkeypatch, simulated_time,
                           lambda compiled, rows: compiled_s[rows] if compiled else 0.05 * rows)
    runtime = policy.runtime
    runtime.batch_sizes = (1, 2, 4, 8, 16)
    policy.warmup(policy.dummy_observation(), iterations=1, race_rounds=2)
    assert runtime.torch_compile is True and runtime.batch_sizes == (1, 2, 4) and policy.threads is None
    assert sorted(set(policy.built_batches)) == [1, 2, 4, 8]          # 16 is never compiled
    report = policy.compile_report
    assert "compiled code kept" in report and "larger batches run eager" in report, report
    assert re.findall(r"(\d+) (kept|dropped) \(", report) == [("2", "kept"), ("4", "kept"), ("8", "dropped")]


def test_a_batch_size_that_cannot_be_built_is_dropped_with_the_larger_and_the_reason_given(monkeypatch):
    """Building batch 4 runs out of memory: batches of 1 and 2 stay built, 4 rows or more run eager."""
    policy = build_tiny_policy(("front",), chunk_size=8, num_steps=2)
    runtime = policy.runtime
    eager = runtime.sample
    built = []

    def sample(inputs, noise, guide=None, path=None):
        if (path or runtime.path) == COMPILED and runtime.build_new_signatures:
            if inputs.batch_size == 4:
                raise RuntimeError("out of memory: tried to allocate 9 GiB\nsecond line")
            built.append(inputs.batch_size)
        return eager(inputs, noise, guide, EAGER)
    monkeypatch.setattr(runtime, "sample", sample)
    runtime.configure(RuntimeConfig(torch_compile=True, batch_sizes=(1, 2, 4, 8)))
    policy.warmup(policy.dummy_observation(), iterations=1, race_rounds=0)
    assert sorted(set(built)) == [1, 2] and runtime.batch_sizes == (1, 2)
    assert policy.build_report == ("batches of 4 or more rows run eager: building batch size 4 failed: "
                                   "RuntimeError: out of memory: tried to allocate 9 GiB")
    runtime.batch_sizes = (4, 8)                      # the first size failing is the caller's to judge
    with pytest.raises(RuntimeError, match="out of memory"):
        policy.warmup(policy.dummy_observation(), iterations=1, race_rounds=0)


def test_compiler_settings_in_the_environment_are_part_of_the_key(monkeypatch):
    from vla_policy_node.runtime.program_cache import compiler_settings

    monkeypatch.delenv("TORCHINDUCTOR_CPP_SIMDLEN", raising=False)
    plain = compiler_settings()
    monkeypatch.setenv("TORCHINDUCTOR_CPP_SIMDLEN", "256")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere")        # where, not what: not in the key
    assert compiler_settings() != plain
    assert compiler_settings()["env"]["TORCHINDUCTOR_CPP_SIMDLEN"] == "256"
    assert "TORCHINDUCTOR_CACHE_DIR" not in compiler_settings()["env"]


def test_prompt_padding_and_camera_names_stay_out_of_the_program_key():
    """Same weights saved with `longest` or `max_length` padding share programs; a model setting does not."""
    import dataclasses

    from vla_policy_node.loading import build_tiny_policy

    def key(**kwargs):
        return build_tiny_policy(chunk_size=8, num_steps=2, **kwargs).runtime.program_key()
    plain = key()
    assert key(padding="longest") == plain
    assert key(camera_names=("wrist",)) == plain            # the camera count is in each program's signature
    assert key(seed=1)["weights"] != plain["weights"]
    policy = build_tiny_policy(chunk_size=8, num_steps=2)
    model = policy.runtime.model
    model.config = dataclasses.replace(model.config, max_period=2.0)
    assert policy.runtime.program_key()["config"] != plain["config"]


def _package_imports(path: Path, package: Path) -> set[str]:
    """Return the package modules a file imports, as paths relative to the package (``model/blocks.py``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('vla_policy_node.'):
            stem = Path(*node.module.split('.')[1:])
            candidates = [stem.with_suffix('.py'), stem / '__init__.py'] + [stem / f'{a.name}.py' for a in node.names]
            found |= {str(c) for c in candidates if (package / c).is_file()}
    return found


def test_traced_code_imports_nothing_outside_the_source_digest():
    """A change to the control loop keeps compiled programs; one to anything they are traced from does not."""
    package = Path(source_digest.__code__.co_filename).parents[1]
    digested = {str(p.relative_to(package)) for source in TRACED_SOURCES
                for p in ((package / source).rglob('*.py') if (package / source).is_dir() else [package / source])}
    assert {'model/blocks.py', 'model/attention.py', 'runtime/compiled.py', 'control/chunking.py'} <= digested
    traced = [p for p in digested if p.startswith(('model/', 'runtime/compiled', 'runtime/engine'))]
    outside = {dep for p in traced for dep in _package_imports(package / p, package)} - digested
    assert not outside, f'traced code imports {sorted(outside)}: add them to TRACED_SOURCES'


def test_the_source_digest_changes_with_traced_code_only(tmp_path):
    package = Path(source_digest.__code__.co_filename).parents[1]
    copy = tmp_path / 'vla_policy_node'
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns('__pycache__', 'touch_policy'))
    before = source_digest(copy)
    assert source_digest(package) == before
    with open(copy / 'control' / 'loop.py', 'a') as f:
        f.write('\n# a change to the control loop\n')
    assert source_digest(copy) == before
    with open(copy / 'model' / 'blocks.py', 'a') as f:
        f.write('\n# a change to a traced module\n')
    assert source_digest(copy) != before
