"""A second level under the local build cache: compiled kernels shared between hosts (issue 38).

The local cache (tuner.kernel.build) is content-addressed: an entry's key is the hash of the
rendered source, the flags and the nvcc version. With a share set (``set_share``; the search
sets one for a study whose workers name an artifact store), a cache miss asks the share for the
entry before compiling, and a finished compile is offered to it, so each config is compiled once
over every host that shares the study. The share is the search layer's (tuner.search.artifacts:
Optuna's artifact store, the study as its index); this module only packs and unpacks an entry,
and checks what it unpacks: a member that is not a plain file of the entry, or an archive whose
sha256 is not the one its publisher recorded, is never unpacked, so no host loads a kernel it
cannot verify.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Protocol

# An entry's files (build.BuildResult's): the library, its record, the SASS check's cubin.
_MEMBER_SUFFIXES = (".so", ".json", ".cubin", ".log", ".cu")


class Share(Protocol):
    def fetch(self, key: str, entry: Path) -> bool: ...
    def publish(self, key: str, entry: Path) -> None: ...


_share: Share | None = None


def set_share(share: Share | None) -> None:
    """The process's share (None: the local cache only)."""
    global _share
    _share = share


def active() -> Share | None:
    return _share


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack(entry: Path) -> bytes:
    """The entry's files as one tar (no folders, no links), the bytes a share stores."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for f in sorted(entry.iterdir()):
            if f.is_file() and not f.is_symlink() and f.name.endswith(_MEMBER_SUFFIXES):
                info = tar.gettarinfo(str(f), arcname=f.name)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0  # the same entry packs to the same bytes
                with f.open("rb") as fh:
                    tar.addfile(info, fh)
    return buf.getvalue()


class ShareError(Exception):
    """What a share returned cannot be used (and is not)."""


def unpack(data: bytes, sha256: str, entry: Path) -> None:
    """Check ``data`` against the publisher's sha256 and its members (plain files with plain
    names, an artifact.json among them), then publish it as ``entry`` by one rename. Raises
    ShareError, leaving nothing behind, when any check fails."""
    got = sha256_bytes(data)
    if got != sha256:
        raise ShareError(f"sha256 {got[:12]}... is not the published {sha256[:12]}...")
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r")
    except tarfile.TarError as e:
        raise ShareError(f"not a tar archive: {e}") from None
    with tar:
        members = tar.getmembers()
        names = {m.name for m in members}
        for m in members:
            if not m.isfile() or "/" in m.name or m.name.startswith(".") or \
                    not m.name.endswith(_MEMBER_SUFFIXES):
                raise ShareError(f"unexpected member {m.name!r}")
        if "artifact.json" not in names:
            raise ShareError("no artifact.json in it")
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".share-{entry.name[:16]}-", dir=entry.parent))
        try:
            for m in members:
                src = tar.extractfile(m)
                if src is None:
                    raise ShareError(f"unreadable member {m.name!r}")
                (tmp / m.name).write_bytes(src.read())
            if entry.exists():  # another builder published it meanwhile: keep theirs
                return
            tmp.rename(entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
