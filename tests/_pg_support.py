"""A throwaway PostgreSQL server for tests and the benchmark: Debian's ``postgresql`` package
(tools/bootstrap.sh installs it), initdb into a temporary folder, its own loopback port and a
Unix socket in that folder, stopped and removed after. Run as root, the server runs as the
``postgres`` OS user (PostgreSQL refuses root).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from _support import need

from fusebox.tooling import free_port

HOW = "install Debian's postgresql package (`make tools` runs tools/bootstrap.sh)"


def pg_bin(name: str) -> str:
    """``initdb``, ``pg_ctl``...: from /usr/lib/postgresql/<newest>/bin, else PATH; ``need`` otherwise."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    return need(found[-1] if found else name, HOW)


class PgServer:
    """``start()``, ``stop()``, ``restart()``, ``create_db(name) -> URL``, ``close()``.

    ``fsync``: False for tests (a crash of the test machine loses nothing worth keeping); the
    benchmark keeps PostgreSQL's default (on)."""

    def __init__(self, fsync: bool = False):
        self.initdb, self.pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
        self.root = Path(tempfile.mkdtemp(prefix="fusebox-pg-"))
        self.data, self.log = self.root / "data", self.root / "pg.log"
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._sh([self.initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
        opts = {"listen_addresses": "127.0.0.1", "unix_socket_directories": str(self.root), "max_connections": "100",
                "fsync": "on" if fsync else "off", "synchronous_commit": "on" if fsync else "off",
                "full_page_writes": "on" if fsync else "off"}
        with open(self.data / "postgresql.conf", "a") as f:
            f.write("".join(f"{k} = '{v}'\n" for k, v in opts.items()) + f"port = {self.port}\n")
        # the superuser without a password (the tests' own set-up); every other role by password
        # (SCRAM), as a production server asks it of the fuse (create_user)
        (self.data / "pg_hba.conf").write_text("local all all trust\n"
                                               "host all postgres 127.0.0.1/32 trust\n"
                                               "host all all 127.0.0.1/32 scram-sha-256\n")

    def _sh(self, cmd: list[str]) -> None:
        r = subprocess.run([*self.as_user, *cmd], capture_output=True, text=True, timeout=120)
        if r.returncode:
            raise RuntimeError(f"{' '.join(cmd)}: {r.stderr or r.stdout}")

    def start(self) -> None:
        self._sh([self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start"])

    def stop(self) -> None:
        self._sh([self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def restart(self) -> None:
        self.stop()
        self.start()

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def create_db(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def create_user(self, user: str, password: str) -> str:
        """A role that logs in with ``password`` (SCRAM) and a database of the same name it owns; its
        URL, password included, as a user puts it in the fuse's store Secret."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url(), autocommit=True) as c:
            c.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(user), sql.Literal(password)))
            c.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(user), sql.Identifier(user)))
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{user}"

    def close(self) -> None:
        try:
            self.stop()
        except Exception:
            pass
        shutil.rmtree(self.root, ignore_errors=True)


def pg_server(fsync: bool = False) -> PgServer | None:
    s = PgServer(fsync)
    s.start()
    return s
