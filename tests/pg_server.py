"""A throw-away PostgreSQL server on localhost for the scale-out tests (test support, not a test).

``PgServer.start()`` runs ``initdb`` into a fresh temporary folder and ``pg_ctl start`` on a free
127.0.0.1 port with its unix socket in that folder (no network beyond localhost, trust
authentication, fsync off: it lives for one test session). PostgreSQL refuses to run as root,
so under root the server runs as the ``postgres`` (or ``nobody``) user. ``missing()`` says why
no server can be started here (binaries or psycopg2 absent), for a skip reason.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BINARIES = ("initdb", "pg_ctl", "postgres")


def find_bin_dir() -> Path | None:
    """The folder holding initdb, pg_ctl and postgres: PATH first, then Debian's layout."""
    on_path = [shutil.which(b) for b in BINARIES]
    if all(on_path):
        return Path(str(on_path[0])).resolve().parent
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if all(os.access(Path(d) / b, os.X_OK) for b in BINARIES):
            return Path(d)
    return None


def _run_as() -> pwd.struct_passwd | None:
    """The unprivileged account the server runs as when we are root (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' user exists")


def missing() -> str | None:
    """Why the PostgreSQL tests cannot run here, or None."""
    if find_bin_dir() is None:
        return ("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or "
                "under /usr/lib/postgresql/*/bin")
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 not installed (pip install 'fa-tune[postgres]')"
    try:
        _run_as()
    except RuntimeError as e:
        return str(e)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    def __init__(self) -> None:
        bindir = find_bin_dir()
        if bindir is None:
            raise RuntimeError(missing() or "no PostgreSQL")
        self.bindir = bindir
        self.user = _run_as()
        # Not pytest's tmp_path: under root that folder is closed to the server's own user.
        self.root = Path(tempfile.mkdtemp(prefix="fa-tune-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = _free_port()
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _cmd(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        kw: dict = {}
        if self.user is not None:
            uid, gid = self.user.pw_uid, self.user.pw_gid

            def drop() -> None:
                os.setgid(gid)
                os.setuid(uid)

            kw["preexec_fn"] = drop
            env["HOME"] = str(self.root)
        p = subprocess.run([str(self.bindir / args[0]), *args[1:]], capture_output=True,
                           text=True, env=env, cwd=self.root, timeout=120, **kw)
        if check and p.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(args[:2])} failed: {p.stdout}{p.stderr}{log}")
        return p

    def start(self) -> PgServer:
        if not self.data.exists():
            self._cmd("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
                      "-E", "UTF8", "--no-sync")
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._cmd("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l",
                  str(self.log), "-o", opts)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        import psycopg2

        deadline = time.time() + 30
        while True:
            try:
                psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres",
                                 dbname="postgres").close()
                return
            except psycopg2.OperationalError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; ``fast`` ends every client connection at once."""
        self._cmd("pg_ctl", "stop", "-w", "-D", str(self.data), "-m", mode, check=False)

    def create_database(self, name: str) -> str:
        """A fresh database on this server; its SQLAlchemy URL."""
        import psycopg2

        con = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres",
                               dbname="postgres")
        con.autocommit = True
        with con.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        con.close()
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def cleanup(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
