"""A process that has imported the trainer once and forks the tests' Python runs from it.

    python tests/distributed/fork_server.py SOCKET PARENT_PID

Every ``python fork_ranks.py ...`` or ``python -m torchtitan.train ...`` a test starts would import
torch and the trainer first (about 5 s of CPU on the 2-core CI machine, some 90 times in the
suite). The server does that once per test process (``fork_client.py`` starts it). A request is
the command's arguments after ``python``, its environment and directory, and an output pipe; the
server forks a child that becomes that command (``fork_ranks``'s ``main``, or the ``-m MODULE`` /
script target as ``python`` would run it), replies with the child's pid, and with its exit code
when it ends. The child starts its own session, so a timeout can kill its whole tree. Nothing but
imports has run in the server, so a child starts from the same state as a fresh interpreter
after them. Requests are served one at a time. The server dies with the test process that started
it (PARENT_PID), and each forked run with the server (parent-death signal, ``tests/reaper.py``),
so a killed test run leaves neither behind.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import fork_ranks  # the trainer's imports, done once
from fork_ranks import die_with_parent

REQUEST_BYTES = 1 << 20


def become(request: dict, out_fd: int, server: int) -> int:
    """In the forked child: take the request's environment, directory and output, run it;
    -> its exit code."""
    die_with_parent(server)
    os.setsid()
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(out_fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    args = request["args"]
    if Path(args[0]).resolve() == Path(fork_ranks.__file__).resolve():
        return fork_ranks.main(args[1:])
    fork_ranks.run_target(args)  # its sys.exit is the run's exit code (run_then_exit)
    return 0


def serve_one(conn: socket.socket, server: socket.socket) -> None:
    message, fds, _, _ = socket.recv_fds(conn, REQUEST_BYTES, 1)
    request = json.loads(message)
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        conn.close()
        server.close()
        fork_ranks.run_then_exit(lambda: become(request, fds[0], me))
    os.close(fds[0])
    try:
        conn.sendall(f"{pid}\n".encode())
    finally:  # reap the child even when the client is gone (it timed out and killed the run)
        _, status = os.waitpid(pid, 0)
    try:
        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    except OSError:
        pass


def serve(path: str, parent: int) -> None:
    die_with_parent(parent)
    server = socket.socket(socket.AF_UNIX)
    server.bind(path + ".new")
    server.listen()
    os.rename(path + ".new", path)  # the client connects once the path exists
    server.settimeout(1.0)
    while os.getppid() == parent:  # orphaned: the test process is gone
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        with conn:
            serve_one(conn, server)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
