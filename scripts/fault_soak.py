"""Fault soak: kill a rank at a random moment, relaunch, N times in a row; the run must end as if
nothing had happened.

    python scripts/fault_soak.py --cycles 100 [--seed 0] [--folder DIR]

Each cycle launches a tiny job (the debug model shrunk to 2 layers of width 64, CPU, gloo,
2 ranks, a checkpoint every step, ``keep_latest_k`` 2), kills one rank with SIGKILL or SIGTERM,
waits for the job to end the way torchrun ends one (the other ranks get SIGTERM 3 s after the
first failure, SIGKILL 10 s later) and relaunches it. Where the rank is killed:

* a fault point (``TORCHTITAN_FAULT``): the start of a step; the start of a checkpoint write,
  synchronous or asynchronous (in the background thread); or between the write and the rename
  of ``step-N.tmp``, synchronous or asynchronous;
* at a random time after the launch (start-up, loading, a step or a save, whatever it meets).

The first cycles cover each kind once, in an order drawn from ``--seed``; the rest are drawn at
random. A last launch trains to the end. Then it checks that the joined loss curve equals an
uninterrupted run's bit for bit (fp32), that no rank ended as a bug (code 1), a job mistake (2)
or with a traceback, that no process is left, no ``.tmp`` folder, exactly the newest
``keep_latest_k`` steps, that the metrics files join into one curve (every step, no unreadable
line) and that the run lock was released. Exit 0 when all hold, else 1 with a line per problem.

The ranks are forks of this process after it imported the trainer once (as the tests'
``fork_ranks.py``), so a cycle costs seconds, not an interpreter start per rank.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchtitan.checkpoint.folders import complete_steps  # noqa: E402
from torchtitan.run_lock import LOCK_NAME  # noqa: E402
from torchtitan.run_metrics import read_metrics  # noqa: E402

NPROC = 2
KEEP = 2
STEP = re.compile(r"^step-\d+$")
MARK = "FAULT_SOAK_ID"  # in every rank's environment: finds a leftover wherever it went
LAST_WORDS, SHUTDOWN, CYCLE_TIMEOUT = 3.0, 10.0, 180.0
ENDINGS = {0: "done", 4: "lost a peer", 143: "stopped (SIGTERM)", -9: "SIGKILL", -15: "SIGTERM"}


def job_args(steps: int, dump_folder: Path, checkpoints: bool = True) -> list[str]:
    args = [
        *("--model.dim=64", "--model.n_layers=2", "--model.n_heads=4", "--model.n_kv_heads=2"),
        *("--training.seq_len=64", "--training.local_batch_size=4", f"--training.steps={steps}"),
        *("--training.global_batch_size=8", "--lr_scheduler.warmup_steps=2", "--optimizer.lr=1e-3"),
        *("--metrics.log_freq=1", "--metrics.enable_tensorboard=false", "--comm.trace_buf_size=0"),
        f"--job.dump_folder={dump_folder}",
    ]
    if checkpoints:
        args += ["--checkpoint.enable", "--checkpoint.interval=1"]
        args.append(f"--checkpoint.keep_latest_k={KEEP}")
    return args


@dataclass(frozen=True)
class Fault:
    signal: str  # KILL or TERM
    at: str  # step, save, saved: a fault point; "time": ``seconds`` after the launch
    asynchronous: bool  # checkpoint.async_mode=async
    rank: int = 0
    step: int = 0
    seconds: float = 0.0

    def spec(self) -> str:
        """The ``TORCHTITAN_FAULT`` value ("" for a timed kill)."""
        if self.at == "time":
            return ""
        return f"{self.signal.lower()}:rank={self.rank}:step={self.step}:at={self.at}"

    def describe(self) -> str:
        mode = "async" if self.asynchronous else "sync"
        where = f"{self.seconds:.2f}s after launch" if self.at == "time" else self.spec()
        return f"SIG{self.signal} rank {self.rank} {where} ({mode} saves)"


# Every kind once first: (signal, at, asynchronous).
COVER = [
    ("KILL", "save", False),
    ("TERM", "save", False),
    ("KILL", "save", True),
    ("TERM", "save", True),
    ("KILL", "saved", False),
    ("KILL", "saved", True),
    ("TERM", "saved", True),
    ("KILL", "step", False),
    ("KILL", "time", True),
    ("TERM", "time", False),
]


def plan(rng: random.Random, cycle: int, resumed: int, steps: int) -> Fault:
    """The fault of cycle ``cycle`` (0-based) of a job resumed after step ``resumed``."""
    if cycle < len(COVER):
        sig, at, asynchronous = COVER[cycle]
    else:
        sig, asynchronous = rng.choice(["KILL", "TERM"]), rng.random() < 0.5
        at = rng.choice(["step", "save", "saved", "time", "time"])
    step = min(resumed + rng.randint(1, 2), steps - 1)
    return Fault(sig, at, asynchronous, rng.randrange(NPROC), step, rng.uniform(0.0, 3.0))


def die_with_parent(parent: int) -> None:
    """SIGKILL when the supervisor ends (Linux): a killed soak leaves no rank behind."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(137)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_rank(rank: int, port: int, log: Path, argv: list[str], env: dict, parent: int):
    """In a forked child: become rank ``rank`` of the job and train; never returns."""
    code = 1
    try:
        die_with_parent(parent)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1), os.dup2(fd, 2), os.close(fd)
        os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(NPROC))
        os.environ.update(LOCAL_WORLD_SIZE=str(NPROC), MASTER_ADDR="127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        import torchtitan.train

        code = torchtitan.train.main(argv)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)


def launch(argv: list[str], env: dict, logs: Path) -> dict[int, int]:
    """Fork the job's ranks; -> pid -> rank."""
    logs.mkdir(parents=True, exist_ok=True)
    port, me, ranks = free_port(), os.getpid(), {}
    sys.stdout.flush(), sys.stderr.flush()
    for rank in range(NPROC):
        pid = os.fork()
        if pid == 0:
            run_rank(rank, port, logs / f"rank_{rank}.log", argv, env, me)
        ranks[pid] = rank
    return ranks


@dataclass
class Ending:
    codes: dict[int, int] = field(default_factory=dict)  # rank -> exit code (-N: signal N)
    sent: list[str] = field(default_factory=list)  # what the supervisor sent, as torchrun would
    hung: bool = False  # not over within CYCLE_TIMEOUT


def wait_job(ranks: dict[int, int], fault: Fault | None, started: float) -> Ending:
    """Wait for every rank, sending a timed fault's signal when it is due; after the first
    failure the others get LAST_WORDS s to end, then SIGTERM, then SIGKILL SHUTDOWN s later."""
    ending, live, failed_at = Ending(), dict(ranks), None
    timed = fault if fault is not None and fault.at == "time" else None
    while live:
        now = time.monotonic()
        if timed is not None and now - started >= timed.seconds:
            for pid in [p for p, r in live.items() if r == timed.rank]:
                os.kill(pid, getattr(signal, f"SIG{timed.signal}"))
            timed = None
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid in live:
            code = ending.codes[live.pop(pid)] = os.waitstatus_to_exitcode(status)
            if code != 0 and failed_at is None:
                failed_at = now
            continue
        if now - started > CYCLE_TIMEOUT and not ending.hung:
            ending.hung, failed_at = True, now - LAST_WORDS
        stops = [("TERM", LAST_WORDS), ("KILL", LAST_WORDS + SHUTDOWN)]
        for name, after in stops if failed_at is not None else []:
            if now - failed_at >= after and name not in ending.sent:
                ending.sent.append(name)
                for each in live:
                    os.kill(each, getattr(signal, f"SIG{name}"))
        time.sleep(0.02)
    return ending


def bad_endings(ending: Ending, logs: Path) -> list[str]:
    """Problems of one launch: a hang, a rank that ended as a bug or a job mistake, a
    traceback (an expected stop is one line)."""
    problems = [f"did not end within {CYCLE_TIMEOUT:.0f} s"] if ending.hung else []
    for rank, code in sorted(ending.codes.items()):
        text = (logs / f"rank_{rank}.log").read_text(errors="replace")
        if code not in ENDINGS or "Traceback" in text:
            tail = "\n    ".join(text.splitlines()[-12:])
            problems.append(f"rank {rank} ended with code {code}; its log ends:\n    {tail}")
    return problems


@dataclass
class Soak:
    folder: Path
    steps: int
    env: dict
    problems: list[str] = field(default_factory=list)
    launches: int = 0

    def run(self, fault: Fault | None, name: str, checkpoints: bool = True) -> Ending:
        """One launch into ``self.folder/run`` (``fault``: None trains undisturbed); without
        ``checkpoints``: the uninterrupted reference, into ``self.folder/reference``."""
        dump = self.folder / ("run" if checkpoints else "reference")
        args = job_args(self.steps, dump, checkpoints)
        if fault is not None and fault.asynchronous:
            args.append("--checkpoint.async_mode=async")
        env = {**self.env, "TORCHTITAN_FAULT": fault.spec() if fault else ""}
        logs = self.folder / "logs" / name
        self.launches += 1
        started = time.monotonic()
        ending = wait_job(launch(args, env, logs), fault, started)
        self.problems += [f"{name}: {p}" for p in bad_endings(ending, logs)]
        if left := running_children():
            self.problems.append(f"{name}: processes left after the job: {left}")
        return ending

    def resumed(self) -> int:
        steps = complete_steps(self.folder / "run" / "checkpoint")
        return steps[0] if steps else 0


def running_children() -> list[int]:
    """This process's children that still run (every rank should have been reaped)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] not in "ZX":
            found.append(int(stat.parent.name))
    return found


def leftovers(mark: str) -> list[int]:
    """Processes anywhere whose environment carries this soak's mark."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"{MARK}={mark}".encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return [p for p in found if p != os.getpid()]


def check_folder(run: Path, reference: list[float], steps: int) -> list[str]:
    """The run's folder after the soak: curve, checkpoints, metrics, lock."""
    problems = []
    metrics = read_metrics(run)
    got_steps, losses = metrics.series("loss")
    if got_steps != list(range(1, steps + 1)):
        missing = sorted(set(range(1, steps + 1)) - set(got_steps))
        problems.append(f"the joined metrics miss steps {missing}")
    elif losses != reference:
        first = next(i for i, (a, b) in enumerate(zip(losses, reference)) if a != b)
        problems.append(
            f"loss differs from the uninterrupted run from step {first + 1}: "
            f"{losses[first]!r} != {reference[first]!r}"
        )
    if metrics.bad_lines:
        problems.append(f"{metrics.bad_lines} unreadable metrics line(s)")
    checkpoints = run / "checkpoint"
    others = sorted(p.name for p in checkpoints.iterdir() if not STEP.match(p.name))
    if others:
        problems.append(f"left in {checkpoints}: {', '.join(others)}")
    kept = complete_steps(checkpoints)
    if kept != list(range(steps, steps - KEEP, -1)):
        problems.append(f"keep_latest_k={KEEP} kept steps {kept}")
    if (run / LOCK_NAME).read_text():
        problems.append(f"{run / LOCK_NAME} still names a holder after the last run")
    return problems


def soak(cycles: int, seed: int, folder: Path, log=print) -> list[str]:
    """Run the soak in ``folder``; -> the problems found ([] when it passed)."""
    import torchtitan.train  # noqa: F401  (the trainer's imports, once, before the forks)

    mark = f"{os.getpid()}-{time.time_ns()}"
    env = {MARK: mark, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    job = Soak(folder, steps=5 * cycles + 10, env=env)
    rng, begin = random.Random(seed), time.monotonic()
    reference = job.run(None, "reference", checkpoints=False)
    endings: dict[str, int] = {}
    for cycle in range(cycles):
        resumed, started = job.resumed(), time.monotonic()
        if resumed >= job.steps - 1:
            job.problems.append(f"the run reached step {resumed} of {job.steps} by cycle {cycle}")
            break
        fault = plan(rng, cycle, resumed, job.steps)
        ending = job.run(fault, f"cycle-{cycle + 1:03d}")
        said = ", ".join(f"rank {r}: {ENDINGS.get(c, c)}" for r, c in sorted(ending.codes.items()))
        sent = f"; sent SIG{'+'.join(ending.sent)}" if ending.sent else ""
        log(
            f"cycle {cycle + 1}/{cycles} from step {resumed}: {fault.describe()}: {said}{sent}"
            f" ({time.monotonic() - started:.1f}s)"
        )
        for code in ending.codes.values():
            endings[ENDINGS.get(code, str(code))] = endings.get(ENDINGS.get(code, str(code)), 0) + 1
    final = job.run(None, "final")
    if any(code != 0 for code in final.codes.values()) or any(reference.codes.values()):
        job.problems.append(f"the final or reference run failed: {final.codes} {reference.codes}")
    if not job.problems:
        curve = read_metrics(folder / "reference").series("loss")[1]
        job.problems += check_folder(folder / "run", curve, job.steps)
    if left := leftovers(mark):
        job.problems.append(f"processes of the soak still running: {left}")
    seconds = time.monotonic() - begin
    log(
        f"fault soak: {cycles} cycles, {job.steps} steps, seed {seed}, {seconds:.0f}s "
        f"({seconds / max(cycles, 1):.1f}s per cycle); rank endings: "
        + ", ".join(f"{k} {v}" for k, v in sorted(endings.items()))
    )
    return job.problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=10, help="kills in a row (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="of the faults' plan (default 0)")
    parser.add_argument(
        "--folder",
        help="work folder, kept (default: a temporary one, removed when the soak passes)",
    )
    args = parser.parse_args(argv)
    if args.cycles < 1:
        parser.error(f"--cycles must be at least 1; got {args.cycles}")
    folder = Path(args.folder or tempfile.mkdtemp(prefix="fault-soak-"))
    problems = soak(args.cycles, args.seed, folder, log=lambda line: print(line, flush=True))
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    if problems:
        print(f"fault soak failed; the runs and their logs are in {folder}", file=sys.stderr)
        return 1
    if args.folder is None:
        shutil.rmtree(folder, ignore_errors=True)
    print("fault soak passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
