"""The artifact cache under concurrent builders: one compile per key, across processes.

nvcc is tests/fixtures/fake_nvcc.py (a clearly named test fixture that sleeps, logs each
compile and writes an empty .so), so builders that want the same key meet inside the compile.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import stat
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tuner.errors import BuildError
from tuner.kernel import build, toolchain

FIX = Path(__file__).resolve().parent / "fixtures"
SOURCE = "// fa-tune cache lock test\nextern \"C\" int f() { return 1; }\n"


@pytest.fixture
def fake_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """CUDA_HOME with the fixture nvcc; returns the log every compile appends a line to."""
    bindir = tmp_path / "cuda" / "bin"
    bindir.mkdir(parents=True)
    nvcc = bindir / "nvcc"
    nvcc.write_text(f"#!/bin/sh\nexec {sys.executable} {FIX / 'fake_nvcc.py'} \"$@\"\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    log = tmp_path / "nvcc.log"
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))
    toolchain._nvcc_version_of.cache_clear()
    yield log
    toolchain._nvcc_version_of.cache_clear()


def _build_in_process(source: str, root: str) -> tuple[str, object]:
    """A separate process's builder (spawned): (key, cache_hit) or ("error", message)."""
    try:
        r = build.build_source(source, name="k", cache_root=Path(root))
    except BuildError as e:
        return ("error", str(e))
    return (r.key, r.cache_hit)


def test_same_key_compiles_once_across_processes_and_threads(fake_nvcc: Path,
                                                             tmp_path: Path) -> None:
    root = tmp_path / "cache"
    ctx = mp.get_context("spawn")
    with ctx.Pool(3) as procs, ThreadPoolExecutor(3) as threads:
        far = [procs.apply_async(_build_in_process, (SOURCE, str(root))) for _ in range(3)]
        near = [threads.submit(_build_in_process, SOURCE, str(root)) for _ in range(3)]
        results = [f.get(timeout=120) for f in far] + [f.result(timeout=120) for f in near]
    assert len(fake_nvcc.read_text().splitlines()) == 1  # one nvcc for six builders
    keys = {k for k, _ in results}
    assert len(keys) == 1 and "error" not in keys
    assert sorted(hit for _, hit in results) == [False] + [True] * 5
    [key] = keys
    assert [p.name for p in root.iterdir()] == [key]  # no temp folders, no lock files here
    assert (root.parent / ".cache.locks" / f"{key}.lock").is_file()


def test_a_failed_build_is_not_compiled_again_by_those_waiting_for_it(
        fake_nvcc: Path, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    bad = SOURCE + "// FAKE_NVCC_FAIL\n"
    with ThreadPoolExecutor(4) as threads:
        results = list(threads.map(lambda _: _build_in_process(bad, str(root)), range(4)))
    assert len(fake_nvcc.read_text().splitlines()) == 1
    assert all(k == "error" and "planted failure" in str(m) for k, m in results)
    # Not cached: a later build (nvcc fixed, say) compiles again.
    assert _build_in_process(bad, str(root))[0] == "error"
    assert len(fake_nvcc.read_text().splitlines()) == 2


def test_lock_is_free_again_after_a_builder_dies(fake_nvcc: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """flock dies with its process: a builder killed mid-compile blocks no one."""
    root = tmp_path / "cache"
    pidfile = tmp_path / "nvcc.pid"
    monkeypatch.setenv("FAKE_NVCC_DELAY_S", "30")
    monkeypatch.setenv("FAKE_NVCC_PIDFILE", str(pidfile))
    p = mp.get_context("spawn").Process(target=_build_in_process, args=(SOURCE, str(root)))
    p.start()
    for _ in range(400):  # until its (fake) nvcc runs, the key's lock held
        if pidfile.is_file() and pidfile.read_text():
            break
        p.join(0.05)
    p.kill()
    p.join(10)
    os.kill(int(pidfile.read_text()), signal.SIGKILL)  # the orphaned compile, ours to end
    monkeypatch.setenv("FAKE_NVCC_DELAY_S", "0")
    key, hit = _build_in_process(SOURCE, str(root))
    assert key != "error" and hit is False


def test_a_compile_killed_by_a_signal_is_no_verdict(fake_nvcc: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C reaches nvcc through the process group: its death is not the config's failure
    (the search measures that trial again), and nothing is recorded against the key."""
    import threading
    import time

    from tuner.search.session import _is_transient_build

    pidfile = tmp_path / "nvcc.pid"
    monkeypatch.setenv("FAKE_NVCC_PIDFILE", str(pidfile))
    monkeypatch.setenv("FAKE_NVCC_DELAY_S", "5")

    def kill_when_started() -> None:
        for _ in range(200):
            if pidfile.is_file() and pidfile.read_text():
                os.kill(int(pidfile.read_text()), signal.SIGTERM)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_when_started)
    killer.start()
    with pytest.raises(BuildError) as ei:
        build.build_source(SOURCE, name="k", cache_root=tmp_path / "cache")
    killer.join()
    assert "was killed by SIGTERM" in str(ei.value) and _is_transient_build(ei.value)
    monkeypatch.setenv("FAKE_NVCC_DELAY_S", "0")
    monkeypatch.delenv("FAKE_NVCC_PIDFILE")
    assert not build.build_source(SOURCE, name="k", cache_root=tmp_path / "cache").cache_hit


def _fake_compiles_under(folder: Path) -> list[int]:
    """The fixture nvcc's processes compiling into ``folder``."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "fake_nvcc.py" in cmd and str(folder) in cmd:
                found.append(int(d.name))
    return found


def test_an_interrupted_parallel_build_ends_its_compiles_at_once(
        fake_nvcc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C or SIGTERM unwinding `build_many` with jobs > 1 (an export's varlen check, `fa-tune
    build --jobs`): the process pool's exit waited for every compile in flight; now its
    processes and their compiler trees are killed and the interruption goes on at once."""
    import threading
    import time

    from tuner.kernel.config import KernelConfig

    class Stop(Exception):
        pass

    def raise_stop(signum: int, frame: object) -> None:
        raise Stop()

    monkeypatch.setenv("FAKE_NVCC_DELAY_S", "120")
    cache = tmp_path / "cache"
    main = threading.get_ident()

    def interrupt_when_both_compile() -> None:
        deadline = time.time() + 60
        while len(_fake_compiles_under(cache)) < 2 and time.time() < deadline:
            time.sleep(0.05)
        signal.pthread_kill(main, signal.SIGUSR1)

    old = signal.signal(signal.SIGUSR1, raise_stop)
    threading.Thread(target=interrupt_when_both_compile, daemon=True).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(Stop):
            build.build_many([KernelConfig(), KernelConfig(block_n=112)], jobs=2,
                             cache_root=cache, check=False)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert time.monotonic() - t0 < 60
    deadline = time.time() + 5
    while _fake_compiles_under(cache) and time.time() < deadline:
        time.sleep(0.05)
    assert not _fake_compiles_under(cache)
