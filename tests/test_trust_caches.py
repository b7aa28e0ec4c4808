"""Every on-disk cache survives what it may find on disk: damaged entries, a directory it cannot use, and
several processes writing at once ([Note: disk caches]).

The caches: the C target's shared libraries and its vector-math probe (``cc.py``), NVRTC's kernels and the
toolchain record (``cache.py``), and ``max-autotune``'s decisions (``autotune.py``). Cases that could kill
the interpreter (a damaged shared library used to die of SIGBUS in ``dlopen``'d code) run in a subprocess, so
that a regression fails the test instead of ending the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from childenv import python_path, run_together

from tilewise.codegen.toolchain import disk, nvrtc_available
from tilewise.codegen.toolchain.cache import TOOLCHAIN_RECORD, KernelCache
from tilewise.codegen.toolchain.disk import DiskCache, seal, unseal

ROOT = Path(__file__).resolve().parent.parent

# prints, as JSON, what the script reports plus every tilewise warning it raised
PRELUDE = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("always")
    _caught = []
    warnings.showwarning = lambda message, *rest, **kw: _caught.append(str(message))

    def report(**values):
        values["warnings"] = [w for w in _caught if w.startswith("tilewise")]
        print(json.dumps(values))
""")

C_PROGRAMS = textwrap.dedent("""
    import numpy as np
    import tilewise as tw
    from tilewise.codegen.toolchain.cc import default_c_cache
    x = tw.arange(16.0) / 4
    functions = [lambda x, k=k: (x * k + 1).exp() for k in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2)]
    outs = [tw.compile(f)(x).numpy() for f in functions]
    wanted = [f(x).numpy() for f in functions]
    same = all(np.allclose(a, b, rtol=1e-6, atol=0) for a, b in zip(outs, wanted))
    stats = default_c_cache().stats
    report(same=same, compiles=stats.compiles, disk_hits=stats.disk_hits, damaged=stats.damaged)
""")
DAMAGE = ["truncated_early", "truncated_half", "truncated_trailer", "garbage", "empty", "flipped_byte", "extended",
          "unsealed"]


def run_script(body: str, cache_dir, *argv: str) -> dict:
    """Run ``body`` in a fresh interpreter with ``TILEWISE_CACHE_DIR=cache_dir``; what it reported."""
    environment = {**os.environ, "TILEWISE_CACHE_DIR": str(cache_dir), "PYTHONPATH": python_path()}
    done = subprocess.run([sys.executable, "-c", PRELUDE + body, *argv], capture_output=True, text=True,
                          env=environment, cwd=ROOT, timeout=300)
    assert done.returncode == 0, f"the process died ({done.returncode}):\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    payload = unseal(data)
    damaged = {
        "truncated_early": data[:3000],  # what once crashed the process: dlopen maps it, running it faults
        "truncated_half": data[: len(data) // 2],
        "truncated_trailer": data[:-5],
        "garbage": os.urandom(len(data)),
        "empty": b"",
        "flipped_byte": data[: len(data) // 3] + bytes([data[len(data) // 3] ^ 0x55]) + data[len(data) // 3 + 1:],
        "extended": data + b"\0" * 64,
        "unsealed": payload if payload is not None else data,  # a whole library as an older version stored it
    }[how]
    path.write_bytes(damaged)


def no_temporaries(directory: Path) -> bool:
    return not [p for p in directory.rglob("*") if p.name.endswith(".tmp")]


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Each test starts as a new process would: no cause reported yet."""
    monkeypatch.setattr(disk, "_warned", set())


def tilewise_warnings(record) -> list[str]:
    return [str(w.message) for w in record if str(w.message).startswith("tilewise")]


# ---------------------------------------------------------------------------- sealing

def test_seal_round_trips_and_rejects_any_change():
    payload = os.urandom(5000)
    sealed = seal(payload)
    assert unseal(sealed) == payload and unseal(seal(b"")) == b""
    assert sealed.startswith(payload), "a sealed library is still an ELF file from its first byte"
    for changed in (sealed[:-1], sealed[1:], sealed + b"x", sealed[:100] + b"y" + sealed[101:], b"", payload):
        assert unseal(changed) is None


# ---------------------------------------------------------------------------- the C target's libraries

def test_damaged_c_libraries_are_rebuilt_not_loaded(tmp_path):
    """One library per kind of damage, all found by one process: each is rebuilt, with one warning in all."""
    count = str(len(DAMAGE))
    first = run_script(C_PROGRAMS, tmp_path, count)
    assert first["same"] and first["compiles"] == len(DAMAGE) and not first["warnings"]
    libraries = sorted(tmp_path.rglob("*.so"))
    assert len(libraries) == len(DAMAGE)
    for library, how in zip(libraries, DAMAGE):
        damage(library, how)

    second = run_script(C_PROGRAMS, tmp_path, count)
    assert second["same"], "the rebuilt libraries compute what eager mode does"
    assert second["compiles"] == second["damaged"] == len(DAMAGE)
    assert len(second["warnings"]) == 1, "one warning per process and cause, not per library"
    assert "damaged entry of the C kernel cache" in second["warnings"][0]

    third = run_script(C_PROGRAMS, tmp_path, count)
    assert third["same"] and third["disk_hits"] == len(DAMAGE) and third["compiles"] == 0 and not third["warnings"]
    assert all(unseal(p.read_bytes()) is not None for p in libraries), "the rebuilt entries replaced the damaged"
    assert no_temporaries(tmp_path)


def test_a_damaged_vector_math_record_is_probed_again(tmp_path):
    """A truncated record would have handed the compiler half a flag."""
    first = run_script(C_PROGRAMS, tmp_path)
    (record,) = tmp_path.rglob("libmvec-*")
    flags = unseal(record.read_bytes())
    damage(record, "truncated_trailer")
    for library in tmp_path.rglob("*.so"):
        library.unlink()
    second = run_script(C_PROGRAMS, tmp_path)
    assert second["same"] and second["compiles"] == 2 and len(second["warnings"]) == 1
    assert unseal(record.read_bytes()) == flags and first["same"]


# ---------------------------------------------------------------------------- NVRTC's kernels

needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="NVRTC is not installed")

KERNELS = [f'extern "C" __global__ void k{n}(float* o) {{ o[threadIdx.x] = {n}.f; }}' for n in range(3)]


def _compile_all(cache: KernelCache) -> list[bytes]:
    return [cache.compile(source, f"k{n}", "sm_90").cubin for n, source in enumerate(KERNELS)]


@needs_nvrtc
@pytest.mark.parametrize("how", DAMAGE[1:])
def test_damaged_nvrtc_entries_are_recompiled_with_one_warning(tmp_path, how, fresh_warnings):
    cubins = _compile_all(KernelCache(tmp_path))
    for entry in tmp_path.rglob("*.kernel"):
        damage(entry, how)
    cache = KernelCache(tmp_path)
    with pytest.warns(RuntimeWarning) as record:
        assert _compile_all(cache) == cubins
    assert cache.stats.compiles == 3 and cache.stats.corrupt_entries == 3
    assert len(tilewise_warnings(record)) == 1
    again = KernelCache(tmp_path)
    _compile_all(again)
    assert again.stats.disk_hits == 3 and again.stats.compiles == 0


@needs_nvrtc
def test_a_damaged_toolchain_record_is_looked_up_again(tmp_path, fresh_warnings):
    cache = KernelCache(tmp_path)
    found = cache.toolchain()
    record = tmp_path / TOOLCHAIN_RECORD
    damage(record, "truncated_half")
    with pytest.warns(RuntimeWarning, match="damaged entry of the CUDA kernel cache"):
        assert KernelCache(tmp_path).toolchain() == found
    assert json.loads(unseal(record.read_bytes()))["nvrtc"] == list(found[0])


# ---------------------------------------------------------------------------- autotuning decisions

@pytest.mark.parametrize("how", ["truncated_half", "garbage", "flipped_byte", "unsealed"])
def test_damaged_decisions_are_ignored_and_replaced(tmp_path, how, fresh_warnings):
    from tilewise.codegen.schedule import Tuned
    from tilewise.compiler.autotune import DecisionCache

    labels, keys = ("a", "b"), ("11" * 32, "22" * 32)
    for key in keys:
        DecisionCache(tmp_path).put(key, Tuned(labels, (2.0, 1.0), 1, False))
    for entry in tmp_path.rglob("*.json"):
        damage(entry, how)
    fresh = DecisionCache(tmp_path)
    with pytest.warns(RuntimeWarning) as record:
        assert all(fresh.get(key, labels) is None for key in keys)
    assert fresh.disk.damaged == 2 and len(tilewise_warnings(record)) == 1
    fresh.put(keys[0], Tuned(labels, (2.0, 1.0), 1, False))
    assert DecisionCache(tmp_path).get(keys[0], labels).winner == 1


def test_a_damaged_decision_is_timed_again_in_a_new_process(tmp_path):
    script = textwrap.dedent("""
        import tilewise as tw
        from tilewise.compiler.autotune import default_decisions
        fn = lambda x: (x.relu() * 0.5 + 1).sum(-1)
        x = tw.ones(64, 256)
        out = tw.compile(fn, mode="max-autotune")(x)
        stats = default_decisions().stats
        report(same=out.tolist() == fn(x).tolist(), timed=stats.timed, disk_hits=stats.disk_hits)
    """)
    first = run_script(script, tmp_path)
    assert first["same"] and first["timed"] >= 1
    for entry in (tmp_path / "autotune").rglob("*.json"):
        damage(entry, "garbage")
    second = run_script(script, tmp_path)
    assert second["same"] and second["timed"] == first["timed"] and second["disk_hits"] == 0
    assert len(second["warnings"]) == 1 and "autotuning decision cache" in second["warnings"][0]


# ---------------------------------------------------------------------------- a directory that cannot be used

EVERY_CACHE = C_PROGRAMS + textwrap.dedent("""
    from tilewise.compiler.autotune import default_decisions
    from tilewise.codegen.toolchain import nvrtc_available
    from tilewise.codegen.toolchain.cache import default_cache
    tune = lambda x: (x.relu() * 0.5 + 1).sum(-1)
    tuned = tw.compile(tune, mode="max-autotune")(tw.ones(64, 256)).tolist() == tune(tw.ones(64, 256)).tolist()
    cubins = 0
    if nvrtc_available():
        for n in range(3):
            src = 'extern "C" __global__ void k%d(float* o) { o[threadIdx.x] = %d.f; }' % (n, n)
            cubins += default_cache().compile(src, "k%d" % n, "sm_90").cubin[:4] == b"\\x7fELF"
    report(same=same, tuned=tuned, cubins=cubins, nvrtc=nvrtc_available(),
           compiles=default_c_cache().stats.compiles)
""")


def _check_runs_without_a_cache(cache_dir, blocker: Path) -> None:
    out = run_script(EVERY_CACHE, cache_dir)
    assert out["same"] and out["tuned"] and out["compiles"] >= 3
    assert out["cubins"] == (3 if out["nvrtc"] else 0)
    assert len(out["warnings"]) == 1, out["warnings"]
    assert str(blocker) in out["warnings"][0] and "TILEWISE_CACHE_DIR" in out["warnings"][0]


def test_a_cache_directory_that_is_a_file(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache directory should be")
    _check_runs_without_a_cache(blocker, blocker)
    assert blocker.read_text() == "a file where the cache directory should be"


def test_a_cache_directory_under_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    _check_runs_without_a_cache(blocker / "kernels", blocker)


def _unwritable_directory(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        directory = tmp_path / "read-only"
        directory.mkdir()
        directory.chmod(0o555)
        return directory
    probe = Path("/sys/kernel")  # root may write anywhere but in sysfs
    try:
        (probe / "tilewise-probe").mkdir()
    except OSError:
        return probe
    pytest.skip("no directory here that this user cannot write")


def test_an_unwritable_cache_directory(tmp_path):
    directory = _unwritable_directory(tmp_path)
    try:
        _check_runs_without_a_cache(directory, directory)
    finally:
        if directory.is_relative_to(tmp_path):
            directory.chmod(0o755)


def test_one_cache_that_cannot_write_keeps_reading(tmp_path, fresh_warnings, monkeypatch):
    """A read-only cache still serves what it holds; writing fails once, with one warning, then stops."""
    writable = DiskCache(tmp_path, "test cache")
    writable.write("ab/entry", b"kept")
    reader = DiskCache(tmp_path, "test cache")

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("tilewise.fileio._create_temporary", refuse)
    with pytest.warns(RuntimeWarning, match="cannot store entries") as record:
        for n in range(5):
            assert reader.write(f"cd/new{n}", b"lost") is None
    assert len(tilewise_warnings(record)) == 1 and reader.write_failures == 1 and not reader.writable
    assert reader.read("ab/entry") == b"kept" and reader.read("cd/new0") is None


# ---------------------------------------------------------------------------- two processes at once

CONCURRENT = textwrap.dedent("""
    import os, time
    from pathlib import Path
    from tilewise.codegen.toolchain.disk import DiskCache
    go = Path(os.environ["GO_FILE"])
    while not go.exists():
        time.sleep(0.001)
    cache = DiskCache(os.environ["TILEWISE_CACHE_DIR"] + "/shared", "test cache")
    mine = os.environ["WHO"].encode() * (1 << 18)
    seen = set()
    for n in range(150):
        assert cache.write("ab/entry", mine) is not None
        got = cache.read("ab/entry")
        seen.add(got[:1])
    exec(open(os.environ["PROGRAMS"]).read())
    report(seen=sorted(s.decode() for s in seen), entry_damaged=cache.damaged)
""")


def test_two_processes_writing_the_same_entries_at_once(tmp_path):
    """Each write publishes a whole entry and each read sees one writer's whole entry; the two processes also
    compile the same programs at the same moment, and both get the right answers."""
    programs = tmp_path / "programs.py"
    programs.write_text(C_PROGRAMS.replace("report(", "c_report = dict("))
    go = tmp_path / "go"
    cache_dir = tmp_path / "cache"
    script = PRELUDE + CONCURRENT.replace("report(seen", "report(**c_report, seen")
    environments = [{**os.environ, "TILEWISE_CACHE_DIR": str(cache_dir), "PYTHONPATH": python_path(),
                     "GO_FILE": str(go), "WHO": who, "PROGRAMS": str(programs)} for who in "AB"]
    outputs = []
    for returncode, stdout, stderr in run_together(script, environments, go, cwd=ROOT):
        assert returncode == 0, stderr[-3000:]
        outputs.append(json.loads(stdout.strip().splitlines()[-1]))
    for out in outputs:
        assert out["entry_damaged"] == out["damaged"] == 0 and out["same"] and not out["warnings"]
        assert set(out["seen"]) <= {"A", "B"}
    assert unseal((cache_dir / "shared" / "ab" / "entry").read_bytes())[:1] in (b"A", b"B")
    libraries = list(cache_dir.rglob("*.so"))
    assert len(libraries) == 2 and all(unseal(p.read_bytes()) is not None for p in libraries)
    assert no_temporaries(cache_dir)
