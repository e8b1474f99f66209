"""Compiled kernels shared between the hosts of one study through Optuna's artifact store
(issue 38): ``fa-tune search`` / ``fa-tune worker --artifacts URL`` (a folder every host mounts,
``file:///path`` or a plain path, which must exist; or ``s3://bucket`` for S3-compatible object
storage, with boto3 installed and its usual credentials).

A build cache miss (tuner.kernel.build) asks ``StudyArtifacts.fetch`` for the entry before
compiling; a compile is offered to ``publish``. Each artifact is one tar of a cache entry
(tuner.kernel.shared_cache.pack), uploaded as ``fa-tune-kernel-<key>-<sha256>.tar``: the study
(its Optuna storage) is the index, the store holds the bytes, and a download is unpacked only
when its sha256 is the one in the name the publisher recorded, so a host never loads a kernel
it cannot verify. Anything that goes wrong with the store costs a compile, never a trial.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.errors import SearchError
from tuner.kernel.shared_cache import ShareError, pack, sha256_bytes, unpack

PREFIX = "fa-tune-kernel-"


STORE_FORMS = "a folder every host mounts (a path or file:///path) or s3://bucket"
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def open_store(url: str) -> Any:
    """The artifact store a URL names: ``s3://bucket`` (Boto3ArtifactStore), else an existing
    folder (``file:///path`` or a path). Any other scheme is refused, and so is a folder that
    does not exist: every host mounts the share, so a missing one is a typo or an unmounted
    share, and making it would keep this host's kernels to itself."""
    import optuna.artifacts as oa

    m = _SCHEME.match(url)
    scheme = m.group(1).lower() if m else None
    if scheme == "s3":
        bucket = url[len("s3://"):].strip("/")
        if not bucket or "/" in bucket:
            raise SearchError(f"--artifacts {url}: give s3://BUCKET (a bucket name alone, e.g. "
                              "s3://my-kernels)")
        try:
            return oa.Boto3ArtifactStore(bucket)
        except Exception as e:  # noqa: BLE001 - boto3 missing or unconfigured
            raise SearchError(f"cannot open the artifact store {url}: {e}") from None
    if scheme not in (None, "file"):
        raise SearchError(f"--artifacts {url}: the {scheme}:// scheme is not supported; give "
                          f"{STORE_FORMS}")
    text = url[len("file://"):] if scheme == "file" else url
    if scheme == "file" and not text.startswith("/"):
        raise SearchError(f"--artifacts {url}: a file URL names an absolute path, e.g. "
                          "file:///mnt/kernels")
    path = Path(text).expanduser()
    if not path.is_dir():
        what = "is not a folder" if path.exists() else "does not exist"
        raise SearchError(f"--artifacts {path} {what}: the store is a folder every host of the "
                          "study mounts; create it (or mount the share) and run again")
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        raise SearchError(f"--artifacts {path} is not readable and writable here; fix its "
                          "permissions or give another folder")
    return oa.FileSystemArtifactStore(str(path))


class StudyArtifacts:
    """The shared build cache of one study (tuner.kernel.shared_cache.Share)."""

    def __init__(self, study: Any, store: Any, note: Callable[[str], None] = lambda s: None
                 ) -> None:
        self.study = study
        self.store = store
        self.note = note
        self._lock = threading.Lock()  # the search's compile threads share it
        self.fetched = 0
        self.published = 0

    def _index(self) -> dict[str, tuple[str, str]]:
        """key -> (artifact id, sha256) of every kernel the study's hosts published."""
        import optuna.artifacts as oa

        out: dict[str, tuple[str, str]] = {}
        for meta in oa.get_all_artifact_meta(self.study):
            name = meta.filename
            if not (name.startswith(PREFIX) and name.endswith(".tar")):
                continue
            key, _, sha = name[len(PREFIX):-len(".tar")].rpartition("-")
            if key and len(sha) == 64:
                out[key] = (meta.artifact_id, sha)
        return out

    def fetch(self, key: str, entry: Path) -> bool:
        import optuna.artifacts as oa

        try:
            found = self._index().get(key)
            if found is None:
                return False
            artifact_id, sha = found
            with tempfile.TemporaryDirectory(prefix="fa-tune-fetch-") as d:
                path = os.path.join(d, "a.tar")
                oa.download_artifact(artifact_store=self.store, file_path=path,
                                     artifact_id=artifact_id)
                unpack(Path(path).read_bytes(), sha, entry)
        except ShareError as e:
            self.note(f"shared kernel {key[:12]} refused ({e}): compiling it here")
            return False
        except Exception as e:  # noqa: BLE001 - the store's trouble costs a compile only
            self.note(f"shared kernel {key[:12]} not fetched ({type(e).__name__}: "
                      f"{str(e)[:120]}): compiling it here")
            return False
        with self._lock:
            self.fetched += 1
        return True

    def publish(self, key: str, entry: Path) -> None:
        import optuna.artifacts as oa

        try:
            if key in self._index():
                return
            data = pack(entry)
            with tempfile.TemporaryDirectory(prefix="fa-tune-publish-") as d:
                path = os.path.join(d, f"{PREFIX}{key}-{sha256_bytes(data)}.tar")
                Path(path).write_bytes(data)
                oa.upload_artifact(artifact_store=self.store, file_path=path,
                                   study_or_trial=self.study)
        except Exception as e:  # noqa: BLE001 - a failed upload costs the other hosts a compile
            self.note(f"kernel {key[:12]} not shared ({type(e).__name__}: {str(e)[:120]})")
            return
        with self._lock:
            self.published += 1
