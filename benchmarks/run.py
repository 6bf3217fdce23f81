"""Run named benchmark rows side by side with the reference framework and write the results file.

    python3 benchmarks/run.py ROW [ROW...] [--set one_gpu|multi_gpu|all] [--variants]
        [--variant NAME[+NAME]...] [--steps N] [--repeat N] [--parallel] [--gpus 0,1,...]
        [--timeout S] [--budget S] [--dry-run] [--list] [--out-dir benchmarks/results]

Run from the repository root of a GPU machine that holds `.peer/` (the reference, pytorch/torchtitan
v0.2.2, built by ../shared/peer/build.sh). The rows live in benchmarks/rows.toml. For each row it
runs the reference, ours, then each chosen variant of ours, one after the other on the same GPUs,
reads the last metrics line of each log (tokens/s per GPU, peak reserved memory of rank 0), and
writes or appends a section to benchmarks/results/<date>-<card>.md (card: h100, h200, ...,
prefixed with Nx for rows of N GPUs). A run that fails or prints no metrics line for its last step
is written as failed with the end of its log, never as a number. With --parallel, the one-GPU
rows go to separate GPUs of the host at the same time (each row's runs stay on its GPU).

The results file is rewritten after every run, so a call stopped midway keeps what it measured.
When $OUT is set (the device machine's return folder) the logs go to $OUT/logs and a copy of each
results file to $OUT/results. Standard library only: no torch or torchtitan import here.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS_FILE = ROOT / "benchmarks" / "rows.toml"
PEER = ROOT / ".peer"
PEER_SITE = Path("/tmp/peer_site")
LOG_FREQ = 10
# Both sides, as ../shared/peer/sbs.sh sets them: NVLink multicast off, unbuffered logs.
GPU_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
    "PYTORCH_ALLOC_CONF": "expandable_segments:True",
}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
EXTRA_ENV: dict[str, str] = {}  # --env KEY=VALUE and --pythonpath DIR, both sides
_print_lock = threading.Lock()
_running: set[subprocess.Popen] = set()  # stopped on SIGTERM/SIGINT
_stopping = threading.Event()


def say(msg: str) -> None:
    with _print_lock:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- rows.toml


def load_toml(path: Path) -> dict:
    try:
        import tomllib  # python 3.11+
    except ModuleNotFoundError:
        return _parse_toml_subset(path.read_text())
    with path.open("rb") as f:
        return tomllib.load(f)


def _strip_comment(line: str) -> str:
    """The line without a trailing ``# comment`` (a ``#`` inside a "string" stays)."""
    in_str = escaped = False
    for i, ch in enumerate(line):
        if in_str:
            escaped = ch == "\\" and not escaped
            if ch == '"' and not escaped:
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == "#":
            return line[:i]
    return line


def _parse_toml_subset(text: str) -> dict:
    """What rows.toml uses, for python 3.10: [a.b] tables and key = JSON-like values (basic
    strings, integers, booleans, arrays of them, possibly over several lines)."""
    data: dict = {}
    table = data
    pending = ""
    for raw in text.splitlines():
        line = _strip_comment(raw).strip()
        if pending:
            pending += " " + line
            if pending.count("[") > pending.count("]"):
                continue
            line, pending = pending, ""
        if not line:
            continue
        if line.startswith("["):
            table = data
            for key in line.strip("[]").split("."):
                table = table.setdefault(key.strip().strip('"'), {})
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if value.startswith("[") and value.count("[") > value.count("]"):
            pending = line
            continue
        value = re.sub(r",\s*]$", "]", value)
        table[key.strip().strip('"')] = json.loads(value)
    return data


@dataclass
class Row:
    name: str
    description: str
    ngpu: int
    config: str
    reference: list[str]
    ours: list[str]
    steps: int = 30
    expect_s: int = 150
    variants: list[str] = field(default_factory=list)


def load_rows(path: Path = ROWS_FILE) -> tuple[dict[str, Row], dict[str, list[str]]]:
    data = load_toml(path)
    variants = {k: shlex.split(v) for k, v in data.get("variants", {}).items()}
    rows = {}
    for name, r in data.get("rows", {}).items():
        rows[name] = Row(
            name=name,
            description=r["description"],
            ngpu=int(r["ngpu"]),
            config=r["config"],
            reference=shlex.split(r["reference"]),
            ours=shlex.split(r["ours"]),
            steps=int(r.get("steps", 30)),
            expect_s=int(r.get("expect_s", 150)),
            variants=list(r.get("variants", [])),
        )
        unknown = [v for v in rows[name].variants if v not in variants]
        if unknown:
            sys.exit(f"{path}: row {name} names unknown variants {unknown}")
    return rows, variants


# ---------------------------------------------------------------- runs


@dataclass
class Run:
    row: Row
    side: str  # "reference" or "ours"
    variant: str  # "" for the default side; else NAME or NAME+NAME
    extra: list[str]  # the variant's arguments
    steps: int
    gpus: list[str]
    pass_no: int = 1
    root: str = "."  # our checkout: the repository root, or --before DIR
    # results
    status: str = "pending"  # pending | ok | failed | skipped
    why: str = ""
    tps: float | None = None
    mem_gib: float | None = None
    loss: float | None = None
    seconds: float = 0.0
    log: Path | None = None
    tail: str = ""

    @property
    def label(self) -> str:
        name = self.side if not self.variant else f"ours + {self.variant.replace('+', ' + ')}"
        return name if self.pass_no == 1 else f"{name} (pass {self.pass_no})"

    @property
    def slug(self) -> str:
        side = self.side if not self.variant else "ours_" + self.variant.replace("+", "-")
        return f"{self.row.name}__{side}" + (f"__pass{self.pass_no}" if self.pass_no > 1 else "")

    def argv_env_cwd(self) -> tuple[list[str], dict[str, str], str]:
        """The command line, the environment it adds, and its working directory (relative to
        the repository root)."""
        env = {"CUDA_VISIBLE_DEVICES": ",".join(self.gpus), "PYTHONPATH": f"{PEER_SITE}:."}
        env.update((k, v) for k, v in EXTRA_ENV.items() if k != "PYTHONPATH")
        if EXTRA_ENV.get("PYTHONPATH"):
            env["PYTHONPATH"] = f"{EXTRA_ENV['PYTHONPATH']}:{env['PYTHONPATH']}"
        dump = f"/tmp/bench_dump/{self.slug}"
        if self.side == "reference":
            argv = [
                "torchrun", f"--nproc_per_node={self.row.ngpu}", "--rdzv_backend", "c10d",
                "--rdzv_endpoint=localhost:0", "--local-ranks-filter", "0", "--role", "rank",
                "--tee", "3", "-m", "torchtitan.train", "--job.config_file", "bench_8b.toml",
                "--training.dataset", "c4_test", "--model.hf_assets_path", "tests/assets/tokenizer",
                "--training.steps", str(self.steps), "--metrics.log_freq", str(LOG_FREQ),
                "--job.dump_folder", dump, *self.row.reference,
            ]  # fmt: skip
            return argv, env, ".peer/torchtitan"
        env.update(PYTHON="python3", NGPU=str(self.row.ngpu), CONFIG_FILE=self.row.config)
        argv = [
            "./run_train.sh", "--training.steps", str(self.steps), "--metrics.log_freq",
            str(LOG_FREQ), "--training.dataset", "sample", "--metrics.enable_tensorboard", "false",
            "--validation.enable", "false", "--job.dump_folder", dump, *self.row.ours, *self.extra,
        ]  # fmt: skip
        return argv, env, self.root

    def shell(self) -> str:
        argv, env, cwd = self.argv_env_cwd()
        line = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(argv)
        return f"(cd {cwd} && {line})" if cwd != "." else line


def plan_runs(rows: list[Row], variant_args: dict[str, list[str]], args) -> list[Run]:
    """Per row: reference, ours, before (--before), the chosen variants; even passes reversed."""
    runs = []
    for row in rows:
        names = list(row.variants) if args.variants else []
        for pick in args.variant:
            only, _, combo = pick.rpartition(":")
            declared = all(part in row.variants for part in combo.split("+"))
            if (only == row.name or (not only and declared)) and combo not in names:
                names.append(combo)
        sides = [("reference", "", [], ".")] * (not args.no_reference) + [("ours", "", [], ".")]
        if args.before:
            sides.append(("before", "", [], args.before))
        for combo in names:
            extra = [a for part in combo.split("+") for a in variant_args[part]]
            sides.append(("ours", combo, extra, "."))
        for n in range(1, args.repeat + 1):
            for side, combo, extra, root in sides if n % 2 else sides[::-1]:
                steps = args.steps or row.steps
                runs.append(Run(row, side, combo, extra, steps, [], pass_no=n, root=root))
    return runs


def parse_metrics(log_text: str, side: str) -> dict[str, float] | None:
    """The last metrics line of a log: step, tokens/s, memory GiB, loss."""
    last = None
    for line in ANSI.sub("", log_text).splitlines():
        if side == "reference":
            m = re.search(r"step:\s*(\d+)\s.*tps:\s*([\d,]+)", line)
            mem = re.search(r"memory:\s*([\d.]+)GiB", line)
            loss = re.search(r"loss:\s*(-?[\d.]+)", line)
        else:
            if "validation" in line:
                continue
            m = re.search(r"\bstep\s+(\d+)/\d+\s.*\btps\s+([\d,]+)", line)
            mem = re.search(r"\bmem\s+([\d.]+)GiB", line)
            loss = re.search(r"\bloss\s+(-?[\d.]+)", line)
        if m:
            last = {
                "step": int(m.group(1)),
                "tps": float(m.group(2).replace(",", "")),
                "mem": float(mem.group(1)) if mem else None,
                "loss": float(loss.group(1)) if loss else None,
            }
    return last


def log_tail(text: str, n: int = 25) -> str:
    lines = [ANSI.sub("", x).rstrip() for x in text.splitlines() if x.strip()]
    return "\n".join(x[:300] for x in lines[-n:])


def execute(run: Run, log_dir: Path, timeout: float) -> None:
    argv, env, cwd = run.argv_env_cwd()
    full_env = {**os.environ, **GPU_ENV, **env}
    run.log = log_dir / f"{run.slug}.log"
    start = time.monotonic()
    with run.log.open("w") as out:
        out.write(f"# {run.shell()}\n")
        out.flush()
        proc = subprocess.Popen(
            argv, cwd=ROOT / cwd, env=full_env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        _running.add(proc)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(proc)
            rc = 124
        finally:
            _running.discard(proc)
    run.seconds = time.monotonic() - start
    text = run.log.read_text(errors="replace")
    metrics = parse_metrics(text, run.side)
    if rc == 0 and metrics and metrics["step"] == run.steps:
        run.status, run.tps, run.mem_gib = "ok", metrics["tps"], metrics["mem"]
        run.loss = metrics["loss"]
        return
    run.status = "failed"
    if rc == 124:
        run.why = f"timed out after {timeout:.0f} s"
    elif rc != 0:
        run.why = f"exit code {rc}"
    else:
        got = f"the last at step {metrics['step']}" if metrics else "none"
        run.why = f"no metrics line for step {run.steps} ({got})"
    run.tail = log_tail(text)


def _on_signal(signum, frame) -> None:
    """Stop the runs in flight (they run in their own process groups) before exiting."""
    _stopping.set()
    for proc in list(_running):
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=5)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
    sys.exit(128 + signum)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the run's whole process group (torchrun and its workers), SIGKILL after 20 s."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# ---------------------------------------------------------------- machine facts


def gpu_names() -> list[str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [x.strip() for x in out.splitlines() if x.strip()]


def card_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; 'NVIDIA H200' -> 'h200'."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    if m:
        return m.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-") or "unknown"


def results_name(date: str, card: str, ngpu: int) -> str:
    return f"{date}-{'' if ngpu == 1 else f'{ngpu}x'}{card}.md"


def versions() -> str:
    try:
        torch_v = subprocess.run(
            ["python3", "-c", "import torch; print(torch.__version__)"],
            capture_output=True, text=True, timeout=120,
        ).stdout.strip() or "unknown"  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        torch_v = "unknown"
    ao = sorted(p.name.split("-")[1] for p in (PEER / "whl").glob("torchao-*.whl"))
    ours = "unknown (no git here)"
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=30,
        ).stdout.strip()  # fmt: skip
        ours = head + (" with uncommitted changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return f"torch {torch_v}, torchao {ao[0] if ao else '-'}; reference v0.2.2; ours {ours}"


def install_peer_site() -> None:
    """The reference's missing packages (and torchao for our Float8), once per machine."""
    if (PEER_SITE / ".done").exists() or not (PEER / "whl").is_dir():
        return
    wheels = sorted(str(p) for p in (PEER / "whl").glob("*.whl"))
    say(f"installing {len(wheels)} wheels from .peer/whl into {PEER_SITE}")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
         "--no-cache-dir", "--target", str(PEER_SITE), *wheels],
        check=True,
    )  # fmt: skip
    (PEER_SITE / ".done").touch()


# ---------------------------------------------------------------- results file


def fmt_num(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


TABLE_HEAD = (
    "| row | GPUs | run | tokens/s/GPU | × reference | × ours | peak GiB | Δ GiB vs reference "
    "| loss | steps |\n|---|---|---|---|---|---|---|---|---|---|"
)


def table_line(run: Run, runs: list[Run]) -> str:
    window = f"{run.steps - LOG_FREQ + 1}–{run.steps}"
    if run.status != "ok":
        what = {"failed": f"**failed**: {run.why}", "skipped": f"skipped: {run.why}"}
        cells = [what.get(run.status, "not run yet"), "", "", "", "", "", window]
    else:
        ref = _same_pass(runs, run, "reference", "")
        ours = _same_pass(runs, run, "ours", "")
        x_ref = x_ours = d_mem = ""
        if ref is not run and ref and ref.status == "ok":
            x_ref = f"{run.tps / ref.tps:.3f}"
            if run.mem_gib is not None and ref.mem_gib is not None:
                d_mem = f"{run.mem_gib - ref.mem_gib:+.2f}"
        if (run.variant or run.side == "before") and ours and ours.status == "ok":
            x_ours = f"{run.tps / ours.tps:.3f}"
        mem, loss = fmt_num(run.mem_gib, ".2f"), fmt_num(run.loss, ".4f")
        cells = [f"{run.tps:,.0f}", x_ref, x_ours, mem, d_mem, loss, window]
    return f"| {run.row.name} | {run.row.ngpu} | {run.label} | " + " | ".join(cells) + " |"


def table(runs: list[Run]) -> str:
    return "\n".join([TABLE_HEAD, *(table_line(r, runs) for r in runs)]) + "\n"


def section(title: str, header: list[str], runs: list[Run]) -> str:
    out = [f"## {title}", "", *header, "", table(runs), "Rows:", ""]
    out += [f"* `{row.name}`: {row.description}." for row in _unique_rows(runs)]
    out += ["", "Commands (from the repository root, `.peer/` built by ../shared/peer/build.sh):"]
    out += ["", "```bash", "export " + " ".join(f"{k}={v}" for k, v in GPU_ENV.items())]
    out += [f"{r.shell()}  # {r.row.name}: {r.label}" for r in runs]
    out += ["```"]
    for r in runs:
        if r.status == "failed":
            out += ["", f"`{r.row.name}` {r.label} failed ({r.why}); the end of its log:", ""]
            out += ["```", r.tail, "```"]
    return "\n".join(out) + "\n"


def _same_pass(runs: list[Run], run: Run, side: str, variant: str) -> Run | None:
    for r in runs:
        if (
            r.row is run.row
            and r.pass_no == run.pass_no
            and r.side == side
            and r.variant == variant
        ):
            return r
    return None


def _unique_rows(runs: list[Run]) -> list[Row]:
    seen: dict[str, Row] = {}
    for r in runs:
        seen.setdefault(r.row.name, r.row)
    return list(seen.values())


class ResultsFiles:
    """One section per results file (rows of one GPU count) for this call, rewritten after every
    run below what the file held before the call."""

    def __init__(self, out_dir: Path, date: str, card: str, card_name: str, header: list[str]):
        self.out_dir, self.date, self.card, self.card_name = out_dir, date, card, card_name
        self.header, self.before, self.lock = header, {}, threading.Lock()

    def path(self, ngpu: int) -> Path:
        return self.out_dir / results_name(self.date, self.card, ngpu)

    def write(self, runs: list[Run]) -> list[Path]:
        written = []
        with self.lock:
            for ngpu in sorted({r.row.ngpu for r in runs}):
                path = self.path(ngpu)
                if path not in self.before:
                    old = path.read_text() if path.exists() else ""
                    if not old:
                        gpus = "" if ngpu == 1 else f"{ngpu}× "
                        old = f"# {self.date}, {gpus}{self.card_name}\n"
                    self.before[path] = old.rstrip("\n") + "\n\n"
                mine = [r for r in runs if r.row.ngpu == ngpu]
                title = f"Side by side, {dt.datetime.now(dt.timezone.utc):%H:%M} UTC: " + ", ".join(
                    f"`{r.name}`" for r in _unique_rows(mine)
                )
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(self.before[path] + section(title, self.header, mine))
                if os.environ.get("OUT"):
                    copy = Path(os.environ["OUT"]) / "results" / path.name
                    copy.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, copy)
                written.append(path)
        return written


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("rows", nargs="*", help="row names from benchmarks/rows.toml")
    ap.add_argument("--set", choices=["one_gpu", "multi_gpu", "all"], help="add a set of rows")
    ap.add_argument("--variants", action="store_true", help="also run each row's variants")
    ap.add_argument(
        "--variant", action="append", default=[], metavar="NAME",
        help="also run this variant for the rows that declare it (NAME+NAME combines; ROW:NAME "
        "for one row, declared or not); repeatable",
    )  # fmt: skip
    ap.add_argument(
        "--no-reference", action="store_true", help="our side only (no .peer/ needed; no ratios)"
    )
    ap.add_argument(
        "--before", metavar="DIR",
        help="also run our default side from the checkout in DIR (an older commit, e.g. a git "
        "worktree carried along), same arguments, same GPUs",
    )  # fmt: skip
    ap.add_argument("--steps", type=int, help="steps per run (a multiple of 10; default per row)")
    ap.add_argument("--repeat", type=int, default=1, help="passes per row; even passes reversed")
    ap.add_argument("--timeout", type=float, default=280, help="seconds per run (default 280)")
    ap.add_argument(
        "--budget", type=float, default=570,
        help="seconds for the whole call (default 570): a run expected to end later is skipped",
    )  # fmt: skip
    ap.add_argument("--gpus", help="GPU indices to use (default: all visible)")
    ap.add_argument(
        "--parallel", action="store_true",
        help="one-GPU rows on separate GPUs at the same time (each row's runs on one GPU)",
    )  # fmt: skip
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--list", action="store_true", help="list the rows and variants")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--log-dir", type=Path, help="default: $OUT/logs, else /tmp/bench_logs")
    ap.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment, both sides",
    )
    ap.add_argument("--pythonpath", help="a folder put first on both sides' PYTHONPATH")
    return ap.parse_args(argv)


def choose_rows(args: argparse.Namespace, rows: dict[str, Row]) -> list[Row]:
    chosen = []
    for name in args.rows:
        if name not in rows:
            near = [n for n in rows if name.split("_")[0] in n]
            sys.exit(f"unknown row {name!r}; rows: {', '.join(near or rows)}")
        chosen.append(rows[name])
    if args.set:
        for row in rows.values():
            in_set = args.set == "all" or (row.ngpu == 1) == (args.set == "one_gpu")
            if in_set and row not in chosen:
                chosen.append(row)
    return chosen


def list_rows(rows: dict[str, Row], variants: dict[str, list[str]]) -> None:
    for name, row in rows.items():
        print(f"{name:<26} {row.ngpu} GPU  {row.description}")
        if row.variants:
            print(f"{'':<26}        variants: {', '.join(row.variants)}")
    print("\nvariants:")
    for name, extra in variants.items():
        print(f"  {name:<28} {shlex.join(extra)}")


def assign_gpus(runs: list[Run], gpus: list[str], parallel: bool) -> dict[str, list[Run]]:
    """Runs per worker (a worker runs its list in order): with --parallel each one-GPU row on
    the next free GPU, everything else after them on the first GPUs, one run at a time."""
    lanes: dict[str, list[Run]] = {}
    serial = []
    rows = _unique_rows(runs)
    for i, row in enumerate(r for r in rows if r.ngpu == 1 and parallel):
        gpu = gpus[i % len(gpus)]
        for run in runs:
            if run.row is row:
                run.gpus = [gpu]
                lanes.setdefault(gpu, []).append(run)
    for run in runs:
        if not run.gpus:
            run.gpus = gpus[: run.row.ngpu]
            serial.append(run)
    if serial:
        lanes["serial"] = serial
    return lanes


def pick_gpus(args: argparse.Namespace, names: list[str], need: int) -> list[str]:
    if args.gpus:
        return args.gpus.split(",")
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        return os.environ["CUDA_VISIBLE_DEVICES"].split(",")
    return [str(i) for i in range(max(len(names), need))]


def plan(args: argparse.Namespace) -> list[Run] | None:
    """The runs the arguments ask for, or None after --list."""
    rows, variant_args = load_rows()
    if args.list:
        list_rows(rows, variant_args)
        return None
    chosen = choose_rows(args, rows)
    if not chosen:
        sys.exit("name rows or a --set (--list shows them)")
    for pick in args.variant:
        only, _, combo = pick.rpartition(":")
        unknown = [p for p in combo.split("+") if p not in variant_args]
        if unknown:
            sys.exit(f"unknown variant {unknown}; variants: {', '.join(variant_args)}")
        if only and only not in {r.name for r in chosen}:
            sys.exit(f"--variant {pick}: row {only} is not among the rows to run")
    if args.before and not (ROOT / args.before / "run_train.sh").is_file():
        sys.exit(f"--before {args.before}: no run_train.sh there (give an older checkout)")
    if args.steps is not None and (args.steps < 2 * LOG_FREQ or args.steps % LOG_FREQ):
        sys.exit(f"--steps must be a multiple of {LOG_FREQ} and at least {2 * LOG_FREQ}")
    EXTRA_ENV.update(kv.split("=", 1) for kv in args.env)
    if args.pythonpath:
        EXTRA_ENV["PYTHONPATH"] = str(Path(args.pythonpath).resolve())
    return plan_runs(chosen, variant_args, args)


def run_lanes(
    lanes: dict[str, list[Run]], runs: list[Run], results: ResultsFiles, log_dir: Path,
    timeout: float, deadline: float,
) -> None:  # fmt: skip
    """Each lane's runs in order; the --parallel lanes at the same time, then the serial one."""

    def work(lane: list[Run]) -> None:
        for run in lane:
            if _stopping.is_set():
                return
            what = f"{run.row.name} {run.label}"
            left = deadline - time.monotonic()
            if left < run.row.expect_s:
                run.status, run.why = "skipped", f"{left:.0f} s of the budget left"
                say(f"{what}: skipped ({run.why})")
            else:
                say(f"{what} on GPU {','.join(run.gpus)} ...")
                execute(run, log_dir, min(timeout, left))
                if run.status == "ok":
                    mem = "" if run.mem_gib is None else f", {run.mem_gib:.2f} GiB"
                    say(f"{what}: {run.tps:,.0f} tokens/s{mem} ({run.seconds:.0f} s)")
                else:
                    say(f"{what}: FAILED, {run.why} ({run.seconds:.0f} s); log {run.log}")
            results.write(runs)

    threads = [
        threading.Thread(target=work, args=(lane,), daemon=True)
        for key, lane in lanes.items()
        if key != "serial"
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    work(lanes.get("serial", []))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = plan(args)
    if runs is None:
        return 0
    need = max(r.row.ngpu for r in runs)
    names = gpu_names()
    gpus = pick_gpus(args, names, need)
    lanes = assign_gpus(runs, gpus, args.parallel)
    first = int(gpus[0]) if gpus[0].isdigit() else len(names)
    card_name = names[first] if first < len(names) else ""
    card = card_slug(card_name) if card_name else "CARD"
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    expected = max(sum(r.row.expect_s for r in lane) for lane in lanes.values())
    files = sorted({str(args.out_dir / results_name(date, card, r.row.ngpu)) for r in runs})
    say(
        f"{len(runs)} runs on GPUs {','.join(gpus)}{' (one-GPU rows in parallel)' * args.parallel}"
        f"; about {expected / 60:.1f} min expected, budget {args.budget / 60:.1f} min; results: "
        + ", ".join(files)
    )
    if expected > args.budget:
        say("that is more than the budget: runs that would end after it will be skipped")
    if not (PEER / "torchtitan").is_dir() and not args.no_reference:
        msg = ".peer/torchtitan is missing: run ../shared/peer/build.sh GIT_DIR (and carry .peer/)"
        if not args.dry_run:
            sys.exit(msg)
        say(f"note: {msg}")
    if args.dry_run:
        print("export " + " ".join(f"{k}={v}" for k, v in GPU_ENV.items()))
        for run in runs:
            print(f"# {run.row.name}: {run.label} (~{run.row.expect_s} s)\n{run.shell()}")
        return 0
    if len(names) < need:
        sys.exit(f"{len(names)} GPUs visible to nvidia-smi; the rows need {need}")
    deadline = time.monotonic() + args.budget
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    install_peer_site()
    out = os.environ.get("OUT")
    log_dir = args.log_dir or (Path(out) / "logs" if out else Path("/tmp/bench_logs"))
    log_dir.mkdir(parents=True, exist_ok=True)
    used = "one per row, rows at the same time" if args.parallel else ",".join(gpus)
    header = [
        f"* Machine: {len(names)}× {card_name}; GPUs used: {used}",
        f"* {versions()}",
        f"* `python3 benchmarks/run.py {shlex.join(sys.argv[1:] if argv is None else argv)}`",
        "* Tokens/s per GPU and peak memory (`max_memory_reserved`, rank 0) of the last metrics "
        "window; × reference and Δ GiB against the reference run of the same row and pass; "
        "× ours against our default run of the same row and pass.",
    ]
    results = ResultsFiles(args.out_dir, date, card, card_name, header)
    results.write(runs)
    run_lanes(lanes, runs, results, log_dir, args.timeout, deadline)
    for path in results.write(runs):
        say(f"wrote {path}")
    print(table(runs))
    return 0 if all(r.status == "ok" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
