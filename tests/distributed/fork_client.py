"""The test side of ``fork_server.py``: start the server on first use, send it a command, collect
the command's output and exit code, and kill the command's tree on a timeout. The server and
what it runs die with this process (``tests/reaper.py``)."""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.reaper import descendants, sigkill_groups

SERVER = Path(__file__).with_name("fork_server.py")
START_SECONDS = 120


class ForkClient:
    def __init__(self):
        self.folder = self.path = None
        self.proc = None
        self.busy = False

    def start(self, env: dict) -> None:
        self.folder = tempfile.mkdtemp(prefix="fork-server-")
        self.path = os.path.join(self.folder, "socket")
        # Output to /dev/null: an orphaned server must not hold the test runner's output open.
        # It dies with this process (fork_server.py): the pid says which one that is.
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), self.path, str(os.getpid())],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        atexit.register(self.stop)
        deadline = time.monotonic() + START_SECONDS
        while not os.path.exists(self.path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fork_server did not start (rc={self.proc.poll()})")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def run(self, args: list[str], env: dict, cwd: str, timeout: float) -> tuple[int | None, str]:
        """Run ``python ARGS``; -> (its exit code, or None after a timeout; its output). On a
        timeout the run's whole process tree is killed."""
        if self.proc is None:
            self.start(env)
        read_end, write_end = os.pipe()
        self.busy = True
        try:
            with socket.socket(socket.AF_UNIX) as conn:
                conn.connect(self.path)
                request = {"args": args, "env": env, "cwd": cwd}
                socket.send_fds(conn, [json.dumps(request).encode()], [write_end])
                os.close(write_end)
                write_end = -1
                return collect(conn, read_end, time.monotonic() + timeout)
        finally:
            self.busy = False
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)


def collect(conn: socket.socket, read_end: int, deadline: float) -> tuple[int | None, str]:
    """Read the run's output until it closes and the server's two replies (pid, exit code)."""
    replies, chunks, pid = b"", [], None
    output_open = True
    while output_open or replies.count(b"\n") < 2:
        watched = [read_end] if output_open else []
        if replies.count(b"\n") < 2:
            watched.append(conn)
        ready, _, _ = select.select(watched, [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            if pid is not None:
                kill_tree(pid)
            return None, b"".join(chunks).decode(errors="replace")
        if read_end in ready:
            chunk = os.read(read_end, 1 << 16)
            output_open = bool(chunk)
            chunks.append(chunk)
        if conn in ready:
            reply = conn.recv(64)
            if not reply:
                raise RuntimeError("fork_server closed the connection before the run ended")
            replies += reply
        if pid is None and b"\n" in replies:
            pid = int(replies.split(b"\n")[0])
    return int(replies.split(b"\n")[1]), b"".join(chunks).decode(errors="replace")


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s process group and every descendant's (a run's own children may have
    started sessions of their own)."""
    sigkill_groups([pid, *descendants(pid)])
