"""Compiled kernels shared between hosts through Optuna's artifact store (issue 38):
tuner/kernel/shared_cache.py (pack, check, unpack) and tuner/search/artifacts.py (the study as
the index, the store holding the bytes).

Two "hosts" are two processes with local caches of their own, one SQLite study and one
FileSystemArtifactStore between them; nvcc is tests/fixtures/fake_nvcc.py (a clearly named test
fixture that logs each compile and writes an empty .so)."""

from __future__ import annotations

import io
import multiprocessing as mp
import tarfile
from pathlib import Path

import optuna
import pytest
from test_cache_lock import SOURCE, fake_nvcc  # noqa: F401 - the fixture

from tuner.kernel import build, shared_cache
from tuner.kernel.shared_cache import ShareError
from tuner.search.artifacts import PREFIX, StudyArtifacts, open_store


def _entry(root: Path) -> Path:
    e = root / "abc123"
    e.mkdir(parents=True)
    (e / "artifact.json").write_text('{"key": "abc123"}')
    (e / "kernel.so").write_bytes(b"\x7fELF not really")
    return e


def test_an_entry_packs_and_unpacks_only_when_it_checks(tmp_path: Path) -> None:
    data = shared_cache.pack(_entry(tmp_path / "a"))
    assert data == shared_cache.pack(tmp_path / "a" / "abc123")  # the same bytes every time
    sha = shared_cache.sha256_bytes(data)
    dest = tmp_path / "b" / "abc123"
    shared_cache.unpack(data, sha, dest)
    assert (dest / "kernel.so").read_bytes() == b"\x7fELF not really"
    bad = bytearray(data)
    bad[-600] ^= 1  # one bit of the library
    with pytest.raises(ShareError, match="is not the published"):
        shared_cache.unpack(bytes(bad), sha, tmp_path / "c" / "abc123")
    assert not (tmp_path / "c" / "abc123").exists()
    buf = io.BytesIO()  # a member outside the entry, with a matching sha256: refused all the same
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("../evil.so")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    evil = buf.getvalue()
    with pytest.raises(ShareError, match="unexpected member"):
        shared_cache.unpack(evil, shared_cache.sha256_bytes(evil), tmp_path / "d" / "abc123")
    assert not (tmp_path / "evil.so").exists() and not (tmp_path / "d" / "abc123").exists()


def _host(url: str, store: str, root: str) -> tuple[str, bool, int, int]:
    """One host (a spawned process): build SOURCE with its own cache, sharing through the
    study's artifacts: (key, cache_hit, fetched, published)."""
    study = optuna.load_study(study_name="s", storage=url)
    share = StudyArtifacts(study, open_store(store))
    shared_cache.set_share(share)
    r = build.build_source(SOURCE, name="k", cache_root=Path(root))
    return r.key, r.cache_hit, share.fetched, share.published


def test_two_hosts_compile_once_and_verify_what_they_fetch(
        fake_nvcc: Path, tmp_path: Path) -> None:  # noqa: F811
    url = f"sqlite:///{tmp_path / 's.db'}"
    optuna.create_study(study_name="s", storage=url)
    store = str(tmp_path / "store")
    Path(store).mkdir()  # a store is a folder every host mounts: it exists
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        a = pool.apply(_host, (url, store, str(tmp_path / "host_a")))
    with ctx.Pool(1) as pool:
        b = pool.apply(_host, (url, store, str(tmp_path / "host_b")))
    assert a[1:] == (False, 0, 1)  # host A compiled and published
    assert b[0] == a[0] and b[1:] == (True, 1, 0)  # host B fetched it: no compile of its own
    assert len(fake_nvcc.read_text().splitlines()) == 1
    assert (tmp_path / "host_b" / a[0] / "k.so").is_file()
    # A store whose file no longer matches the sha256 the study recorded is not used: host C
    # compiles instead, and says why.
    study = optuna.load_study(study_name="s", storage=url)
    [meta] = optuna.artifacts.get_all_artifact_meta(study)
    assert meta.filename.startswith(f"{PREFIX}{a[0]}-")
    [stored] = [p for p in Path(store).rglob("*") if p.is_file()]
    stored.write_bytes(stored.read_bytes()[:-10] + b"0123456789")
    notes: list[str] = []
    share = StudyArtifacts(study, open_store(store), notes.append)
    shared_cache.set_share(share)
    try:
        c = build.build_source(SOURCE, name="k", cache_root=tmp_path / "host_c")
    finally:
        shared_cache.set_share(None)
    assert not c.cache_hit and share.fetched == 0
    assert any("refused" in n and "is not the published" in n for n in notes), notes
    assert len(fake_nvcc.read_text().splitlines()) == 2


def test_a_search_shares_through_the_store_it_is_given(tmp_path: Path, monkeypatch) -> None:
    """`fa-tune search --artifacts URL`: the search's builds see the study's share while it
    runs (the real builder then fetches and publishes through it), and no share after."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_search import make

    from tuner.kernel.config import KernelConfig

    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    monkeypatch.setenv("FAKE_GPU_WORKER_PLAN", str(plan))
    seen: list[object] = []
    fake = make(tmp_path, {"block_n": [128]}, trials=1).builder  # the fixture builder

    def builder(cfg: KernelConfig):  # noqa: ANN202 - the fixture's build
        seen.append(shared_cache.active())
        return fake(cfg)

    (tmp_path / "store").mkdir()
    s = make(tmp_path, {"block_n": [128]}, trials=1, study="v", builder=builder,
             artifacts=str(tmp_path / "store"))
    s.run()
    assert seen and all(isinstance(x, StudyArtifacts) and x.study.study_name == "v" for x in seen)
    assert shared_cache.active() is None
