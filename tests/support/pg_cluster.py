"""A throwaway PostgreSQL cluster for tests and benches: initdb + pg_ctl in a temporary
folder, listening on 127.0.0.1 on a free port, trust authentication, stopped at the end.

Run as root (CI, these machines), the cluster belongs to the ``postgres`` user, as initdb
refuses to run as root. ``python -m tests.support.pg_cluster start DIR`` prints the URL;
``stop DIR`` stops it (used by .ci/run).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path


class ClusterUnavailable(RuntimeError):
    """No PostgreSQL server could be started here (binaries missing, initdb failed…)."""


def _bin_dir() -> Path | None:
    for candidate in [os.environ.get("KEEPSTEP_PG_BIN", ""),
                      *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]:
        if candidate and (Path(candidate) / "initdb").is_file():
            return Path(candidate)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_owner(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


class Cluster:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.data = self.folder / "data"
        self.port = 0
        bindir = _bin_dir()
        if bindir is None:
            raise ClusterUnavailable("PostgreSQL's initdb was not found (install `postgresql`)")
        self.bin = bindir

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/keepstep"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(_as_owner(list(args)), capture_output=True, text=True,
                              cwd="/", timeout=120)
        if check and proc.returncode != 0:
            raise ClusterUnavailable(f"{Path(args[0]).name} failed: "
                                     f"{(proc.stderr or proc.stdout).strip()[-800:]}")
        return proc

    def start(self) -> str:
        self.folder.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        if not (self.data / "PG_VERSION").exists():
            self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                      "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
        self.start_server()
        self._run(str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                  "-U", "postgres", "keepstep")
        return self.url

    def start_server(self) -> None:
        if not self.port:
            self.port = _free_port()
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories= "
                "-c fsync=off -c synchronous_commit=on -c full_page_writes=off "
                "-c max_connections=200")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l",
                  str(self.folder / "server.log"), "-o", opts, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop",
                  check=False)

    def restart(self) -> None:
        self.stop()
        self.start_server()


def start_temporary() -> Cluster:
    folder = Path(tempfile.mkdtemp(prefix="keepstep-pg-"))
    os.chmod(folder, 0o755)
    cluster = Cluster(folder / "pg")
    cluster.start()
    return cluster


if __name__ == "__main__":
    what, where = sys.argv[1], Path(sys.argv[2])
    if what == "start":
        c = Cluster(where)
        print(c.start())
    else:
        c = Cluster(where)
        c.stop()
