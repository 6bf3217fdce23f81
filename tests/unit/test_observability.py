"""Flight Recorder helpers, hang report (synthetic dumps), faults, non-finite checks, profiler."""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from torchtitan.config import Comm, Optimizer, Profiling
from torchtitan.observability import fault_injection as fi
from torchtitan.observability import flight_recorder as fr
from torchtitan.observability import hang_report
from torchtitan.observability.numerics import NonFiniteError, NonFiniteGuard, check_finite
from torchtitan.observability.profiling import maybe_profile
from torchtitan.optim import build_optimizer

# --------------------------------------------------------------------------- fault injection


def test_fault_spec_parsing():
    assert fi.parse("skip_collective:rank=1:step=3") == (fi.Fault("skip_collective", 3, 1),)
    assert fi.parse("delay:rank=1:step=3:seconds=30") == (fi.Fault("delay", 3, 1, 30.0),)
    assert fi.parse(" nan_loss:step=4 ; crash:rank=1:step=5 ;") == (
        fi.Fault("nan_loss", 4),
        fi.Fault("crash", 5, 1),
    )
    assert fi.parse("kill:rank=0:step=3:at=commit") == (fi.Fault("kill", 3, 0, at="commit"),)
    assert fi.parse("delay:step=0:at=join:seconds=9") == (
        fi.Fault("delay", 0, None, 9.0, at="join"),
    )
    assert fi.parse("") == ()


@pytest.mark.parametrize(
    "spec, words",
    [
        ("explode:step=1", "unknown fault 'explode'"),
        ("delay:rank=1:step=3", "delay needs seconds"),
        ("crash:rank=1", "crash needs step"),
        ("crash:step=x", "step must be a number"),
        ("crash:step=1:when=now", "crash takes at, attempt, rank, step; got 'when'"),
        ("crash:step", "expected key=value"),
        ("crash:step=-1", "must be >= 0"),
    ],
)
def test_fault_spec_errors_are_one_line(spec, words):
    with pytest.raises(ValueError) as e:
        fi.parse(spec)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert "TORCHTITAN_FAULT" in str(e.value)


def test_maybe_inject(monkeypatch):
    monkeypatch.delenv(fi.ENV, raising=False)
    assert not fi.maybe_inject("skip_collective", 3, 1)  # inert without the variable
    monkeypatch.setenv(fi.ENV, "skip_collective:rank=1:step=3;nan_loss:step=4;crash:rank=0:step=5")
    assert fi.maybe_inject("skip_collective", 3, 1)
    assert not fi.maybe_inject("skip_collective", 3, 0)
    assert not fi.maybe_inject("skip_collective", 4, 1)
    assert fi.maybe_inject("nan_loss", 4, 0) and fi.maybe_inject("nan_loss", 4, 7)
    with pytest.raises(fi.InjectedFault, match="injected crash at step 5 on rank 0"):
        fi.maybe_inject("crash", 5, 0)
    assert fi.maybe_inject("delay", 2, 0, faults=fi.parse("delay:step=2:seconds=0.01"))
    with pytest.raises(ValueError, match="unknown fault kind"):
        fi.maybe_inject("skip", 1, 0)


# --------------------------------------------------------------------------- non-finite


def test_check_finite():
    assert check_finite(2.5, 1.0, step=1) == "ok"
    assert check_finite(torch.tensor(2.5), torch.tensor(1.0), step=1) == "ok"
    assert check_finite(2.5, None, step=1) == "ok"
    with pytest.raises(NonFiniteError) as e:
        check_finite(float("nan"), 1.0, step=4, policy="stop")
    msg = str(e.value)
    assert msg.startswith("non-finite loss (nan) at step 4;") or "loss (nan) at step 4" in msg
    assert "\n" not in msg and "on_nonfinite=skip" in msg
    with pytest.raises(NonFiniteError, match=r"non-finite grad_norm \(\+inf\) at step 7"):
        check_finite(torch.tensor(3.0), torch.tensor(float("inf")), step=7)
    assert check_finite(float("nan"), float("nan"), step=4, policy="skip") == "skip"
    with pytest.raises(ValueError, match="must be one of stop, skip"):
        check_finite(1.0, 1.0, step=1, policy="ignore")


# --------------------------------------------------------------------------- profiler


def _profiling(**kw) -> Profiling:
    return Profiling(**{"enable_profiling": True, "profile_freq": 2, "profiler_warmup": 1,
                        "profiler_active": 1, **kw})  # fmt: skip


def test_profiler_writes_traces(tmp_path):
    model = torch.nn.Linear(16, 16)
    with maybe_profile(_profiling(), tmp_path, rank=0) as prof:
        for _ in range(4):
            model(torch.randn(4, 16)).sum().backward()
            prof.step()
    for it in (2, 4):
        path = tmp_path / "profile_traces" / f"iteration_{it}" / "rank0_trace.json"
        assert path.is_file(), sorted(p.name for p in tmp_path.rglob("*"))
        events = json.loads(path.read_text())["traceEvents"]
        assert any("addmm" in str(e.get("name", "")) for e in events)
    assert not (tmp_path / "profile_traces" / "iteration_1").exists()


def test_profiler_resume_aligns_windows_and_inert_when_disabled(tmp_path):
    with maybe_profile(_profiling(profile_freq=3), tmp_path, rank=1, start_step=4) as prof:
        for _ in range(3):  # steps 5, 6, 7: the window ends on step 6
            torch.ones(2).sum()
            prof.step()
    assert [p.name for p in (tmp_path / "profile_traces").iterdir()] == ["iteration_6"]
    with maybe_profile(Profiling(), tmp_path / "off", rank=0) as prof:
        prof.step()
    assert not (tmp_path / "off").exists()


def test_profiler_bad_window_and_cpu_memory_snapshot(tmp_path, caplog):
    with pytest.raises(ValueError, match="profile_freq >= profiler_warmup"):
        maybe_profile(_profiling(profile_freq=2, profiler_warmup=2), tmp_path, rank=0)
    if torch.cuda.is_available():
        pytest.skip("the CPU fallback only")
    with caplog.at_level(logging.WARNING, logger="torchtitan"):
        with maybe_profile(Profiling(enable_memory_snapshot=True), tmp_path, rank=0) as prof:
            prof.step()
    assert "enable_memory_snapshot needs CUDA" in caplog.text


# --------------------------------------------------------------------------- flight recorder


def test_configure_env_sets_defaults_and_respects_the_user(tmp_path):
    env: dict[str, str] = {}
    added = fr.configure_env(Comm(trace_buf_size=123, dump_wait_seconds=8), tmp_path, environ=env)
    assert added == env
    assert env == {
        "TORCH_FR_BUFFER_SIZE": "123",
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "comm_traces" / "rank_"),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_ENABLE_MONITORING": "1",
        "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "8000",
    }
    assert (tmp_path / "comm_traces").is_dir()

    # set by the user, old names included: left alone, and no alias added beside them
    user = {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "50",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "mine" / "t_"),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
    }
    added = fr.configure_env(Comm(), tmp_path, environ=user)
    assert set(added) == {"TORCH_NCCL_ENABLE_MONITORING", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"}
    assert user["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0" and (tmp_path / "mine").is_dir()

    off: dict[str, str] = {}
    fr.configure_env(Comm(trace_buf_size=0), tmp_path / "x", environ=off)
    assert off == {"TORCH_FR_BUFFER_SIZE": "0"}


def test_dump_and_set_timeout_on_a_one_rank_gloo_group(tmp_path):
    assert not dist.is_initialized()
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    try:
        sub = dist.new_group([0], group_desc="metrics")
        dist.all_reduce(torch.ones(8, dtype=torch.bfloat16), group=sub)
        assert fr.set_train_timeout(7) == 2
        dist.all_reduce(torch.ones(3), group=sub)
        path = fr.dump(tmp_path / "traces", reason="test")
        assert path == tmp_path / "traces" / "rank_0"
        d = pickle.loads(path.read_bytes())
        assert {"entries", "pg_config", "version", "torchtitan"} <= set(d)
        assert {c["desc"] for c in d["pg_config"].values()} == {"default_pg", "metrics"}
        assert all(c["ranks"] == "[0]" for c in d["pg_config"].values())
        before, after = d["entries"][-2:]
        assert before["profiling_name"].endswith("all_reduce") and before["input_sizes"] == [[8]]
        assert before["input_dtypes"] == ["BFloat16"] and before["process_group"][1] == "metrics"
        # A sub-group does not inherit init_process_group's timeout (it gets the backend's
        # default, 30 min on gloo) -- one more reason to set every group's timeout explicitly.
        assert before["timeout_ms"] not in (60_000, 7_000)
        assert after["timeout_ms"] == 7_000
        assert d["torchtitan"]["reason"] == "test"
        assert not list((tmp_path / "traces").glob(".partial*"))
    finally:
        dist.destroy_process_group()


def test_dump_on_failure(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RuntimeError, match="boom"):
        with fr.dump_on_failure(tmp_path / "a", rank=3):
            assert signal.getsignal(signal.SIGTERM) is not before
            raise RuntimeError("boom\nsecond line")
    d = pickle.loads((tmp_path / "a" / "rank_3").read_bytes())
    assert d["torchtitan"]["reason"] == "RuntimeError: boom"
    assert signal.getsignal(signal.SIGTERM) is before

    with pytest.raises(fr.Terminated) as e:
        with fr.dump_on_failure(tmp_path / "b", rank=0):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes
                pass
    assert e.value.code == 143
    meta = pickle.loads((tmp_path / "b" / "rank_0").read_bytes())["torchtitan"]
    assert meta["reason"] == "Terminated: received SIGTERM"

    with pytest.raises(SystemExit):
        with fr.dump_on_failure(tmp_path / "c", rank=0):
            raise SystemExit(0)
    with pytest.raises(RuntimeError):
        with fr.dump_on_failure(tmp_path / "d", enabled=False, rank=0):
            raise RuntimeError("x")
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


def test_dump_on_failure_only_where_dump_if_says(tmp_path):
    """The trainer dumps for communication failures only: not for a user error, a non-finite
    loss or a data error, which say nothing about the collectives."""
    with pytest.raises(NonFiniteError):
        with fr.dump_on_failure(tmp_path / "a", rank=0, dump_if=fr.is_communication_failure):
            raise NonFiniteError("non-finite loss")
    assert not (tmp_path / "a").exists()
    with pytest.raises(RuntimeError):
        with fr.dump_on_failure(tmp_path / "b", rank=0, dump_if=fr.is_communication_failure):
            raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")
    assert (tmp_path / "b" / "rank_0").is_file()


# --------------------------------------------------------------------------- hang report


def _entry(
    pg, seq, op="all_reduce", shape=(1024,), dtype="Float", rid=0, done=True, desc="", t=None
):
    return {
        "record_id": rid,
        "process_group": (pg, desc),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "profiling_name": f"gloo:{op}",
        "input_sizes": [list(shape)],
        "input_dtypes": [dtype],
        "state": "scheduled",
        "retired": done,
        "time_created_ns": 1000 * seq + rid if t is None else t,
        "is_p2p": False,
        "frames": [
            {"name": "all_reduce", "filename": "/x/torch/distributed/c10d.py", "line": 1},
            {"name": "train_step", "filename": "/job/train.py", "line": 42},
        ],
    }


def _dump(rank, entries, groups, world_size=None):
    config = {n: {"name": n, "desc": d, "ranks": str(r)} for n, (d, r) in groups.items()}
    meta = {"rank": rank, "world_size": world_size, "reason": "RuntimeError: timed out"}
    return {"version": "2.10", "pg_config": config, "entries": entries, "torchtitan": meta}


def _steps(pg, n_steps, ops, desc="", start_rid=0):
    """Entries of ``n_steps`` steps, each issuing ``ops`` (op, shape) on ``pg``, all completed."""
    out, seq = [], 0
    for _ in range(n_steps):
        for op, shape in ops:
            seq += 1
            out.append(_entry(pg, seq, op, shape, rid=start_rid + len(out), desc=desc))
    return out


DEFAULT4 = {"0": ("default_pg", [0, 1, 2, 3])}


def test_hang_report_rank_behind():
    dumps = {}
    for r in range(4):
        entries = _steps("0", 11, [("all_reduce", (1024,))])
        if r != 1:
            entries.append(_entry("0", 12, rid=11, done=False))
        dumps[r] = _dump(r, entries, DEFAULT4)
    lines = hang_report.analyze(dumps)
    assert lines[0] == (
        "rank 1 is behind: ranks 0, 2, 3 reached all_reduce #12 (pg 'default_pg' [0, 1, 2, 3], "
        "float32[1024]) but rank 1 stopped at #11 (all_reduce float32[1024])"
    )
    assert any("train.py:42 (train_step)" in line for line in lines)


def test_hang_report_type_mismatch_majority():
    groups = {"0": ("default_pg", [0, 1, 2])}
    dumps = {}
    for r in range(3):
        entries = _steps("0", 6, [("all_reduce", (1024,))])
        op, shape = ("all_gather", (1,)) if r == 1 else ("all_reduce", (1024,))
        entries.append(_entry("0", 7, op, shape, rid=6, done=False))
        dumps[r] = _dump(r, entries, groups)
    assert hang_report.analyze(dumps)[0] == (
        "rank 1 called all_gather float32[1] where ranks 0, 2 called all_reduce float32[1024] "
        "at #7 of pg 'default_pg' [0, 1, 2]"
    )


def test_hang_report_tie_is_broken_by_the_pattern_of_earlier_steps():
    groups = {"0": ("default_pg", [0, 1])}
    step = [("all_reduce", (1024,)), ("all_gather", (1,))]
    dumps = {}
    for r in range(2):
        entries = _steps("0", 2, step)
        # rank 0 skipped its all_reduce: its all_gather meets rank 1's all_reduce at #5
        op, shape = step[1] if r == 0 else step[0]
        entries.append(_entry("0", 5, op, shape, rid=4, done=False))
        dumps[r] = _dump(r, entries, groups)
    assert hang_report.analyze(dumps)[0].startswith(
        "rank 0 called all_gather float32[1] where rank 1 called all_reduce float32[1024] at #5"
    )
    # dtype only differs, and no history: the report cannot pick one and says so
    d0 = _dump(0, [_entry("0", 1, dtype="BFloat16", done=False)], groups)
    d1 = _dump(1, [_entry("0", 1, done=False)], groups)
    assert hang_report.analyze({0: d0, 1: d1})[0] == (
        "ranks 0, 1 disagree at #1 of pg 'default_pg' [0, 1]: rank 0 called all_reduce "
        "bfloat16[1024]; rank 1 called all_reduce float32[1024]"
    )


def test_hang_report_missing_rank():
    dumps = {}
    for r in (0, 1, 2):
        entries = _steps("0", 4, [("all_reduce", (1024,))])
        entries.append(_entry("0", 5, rid=4, done=False))
        dumps[r] = _dump(r, entries, DEFAULT4, world_size=4)
    lines = hang_report.analyze(dumps)
    assert lines[0].startswith("no dump from rank 3 — it may have died")
    assert "ranks 0, 1, 2 wait in all_reduce #5 of pg 'default_pg' [0, 1, 2, 3]" in lines[1]


def test_hang_report_cycle_across_groups_blames_the_rank_that_broke_its_pattern():
    # Each step: all_reduce on 'grads', all_gather on 'metrics'. Rank 1 skipped the all_reduce
    # of step 3 and waits in the all_gather; rank 0 waits in the all_reduce.
    groups = {"0": ("default_pg", [0, 1]), "1": ("grads", [0, 1]), "2": ("metrics", [0, 1])}
    dumps = {}
    for r in range(2):
        entries, rid = [], 0
        for step in (1, 2):
            entries.append(_entry("1", step, "all_reduce", (1024,), rid=rid, desc="grads"))
            entries.append(_entry("2", step, "all_gather", (1,), rid=rid + 1, desc="metrics"))
            rid += 2
        if r == 0:
            entries.append(_entry("1", 3, "all_reduce", (1024,), rid=rid, done=False))
        else:
            entries.append(_entry("2", 3, "all_gather", (1,), rid=rid, done=False))
        dumps[r] = _dump(r, entries, groups)
    assert hang_report.analyze(dumps)[0].startswith(
        "rank 1 is behind: rank 0 reached all_reduce #3 (pg 'grads' [0, 1], float32[1024]) "
        "but rank 1 stopped at #2"
    )


def test_hang_report_2d_mesh_victims_are_not_blamed():
    # tp groups {0,1} {2,3}, dp groups {0,2} {1,3}. Rank 3 never reaches tp all_reduce #5;
    # rank 2 waits in it; ranks 0 and 1 went on to the dp all_reduce and wait for 2 and 3.
    # Sibling groups share a name, as split_group (DeviceMesh) makes them.
    tp_ranks = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
    dp_ranks = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}
    tp, dp = dict.fromkeys(range(4), "1"), dict.fromkeys(range(4), "2")
    dumps = {}
    for r in range(4):
        mine = {"1": ("mesh_tp", tp_ranks[r]), "2": ("mesh_dp", dp_ranks[r])}
        e = []
        for step in (1, 2):  # each step: two tp all_reduces, then one dp all_reduce
            for i in (1, 2):
                e.append(_entry(tp[r], 2 * step - 2 + i, shape=(64,), rid=len(e), t=len(e)))
            e.append(_entry(dp[r], step, rid=len(e), t=len(e)))
        if r in (0, 1, 2):
            e.append(_entry(tp[r], 5, shape=(64,), rid=6, done=r != 2, t=6))
        if r in (0, 1):
            e.append(_entry(dp[r], 3, rid=7, done=False, t=7))
        dumps[r] = _dump(r, e, mine)
    assert hang_report.analyze(dumps)[0] == (
        "rank 3 is behind: rank 2 reached all_reduce #5 (pg 'mesh_tp' [2, 3], float32[64]) "
        "but rank 3 stopped at #4 (all_reduce float32[64])"
    )


def test_hang_report_no_desync_and_raw_gloo_dump():
    # A raw torch dump: gloo's bogus pg_config and no torchtitan metadata.
    dumps = {}
    for r in range(2):
        entries = _steps("0", 3, [("all_reduce", (8,))], desc="default_pg")
        dumps[r] = {"pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}}, "entries": entries}
    lines = hang_report.analyze(dumps)
    assert lines[0].startswith(
        "no desync found: all ranks' last collectives agree: all_reduce #3 of pg 'default_pg' "
        "[0, 1] (completed)"
    )


def test_hang_report_cli(tmp_path, capsys):
    assert hang_report.main([str(tmp_path)]) == 1
    groups = {"0": ("default_pg", [0, 1])}
    for r in range(2):
        entries = _steps("0", 2, [("all_reduce", (4,))])
        if r == 0:
            entries.append(_entry("0", 3, shape=(4,), rid=2, done=False))
        (tmp_path / f"rank_{r}").write_bytes(pickle.dumps(_dump(r, entries, groups)))
    (tmp_path / "timing_0.json").write_text("{}")
    capsys.readouterr()
    assert hang_report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("rank 1 is behind: rank 0 reached all_reduce #3")
    assert hang_report.main([str(tmp_path / "nope")]) == 2


def test_config_sections_have_the_observability_fields():
    comm, prof = Comm(), Profiling()
    assert (comm.trace_buf_size, comm.flight_recorder_folder) == (20000, "comm_traces")
    assert comm.train_timeout_seconds < comm.init_timeout_seconds
    assert prof.save_traces_folder == "profile_traces" and not prof.enable_profiling
    assert SimpleNamespace(**vars(prof)).profile_freq == 100


def test_fault_attempt_matches_only_that_restart(monkeypatch):
    from torchtitan.observability.fault_injection import parse

    (fault,) = parse("kill:rank=1:step=7:attempt=0")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert fault.matches("kill", 7, 1)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert not fault.matches("kill", 7, 1)


# --------------------------------------------------------------------------- NonFiniteGuard


def _fused_model_and_optimizer(implementation: str = "fused"):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    compiled = implementation == "compiled"  # the experimental switch (CUDA; runs on CPU)
    cfg = Optimizer(lr=0.1, implementation="fused" if compiled else implementation)
    optimizer = build_optimizer(model.parameters(), cfg, "cuda" if compiled else "cpu", compiled)
    model(torch.randn(2, 4)).sum().backward()
    return model, optimizer


@pytest.mark.parametrize("implementation", ["fused", "compiled"])
def test_guard_defers_with_fused_optimizers_and_skips_the_update(implementation):
    model, optimizer = _fused_model_and_optimizer(implementation)
    before = [p.detach().clone() for p in model.parameters()]
    guard = NonFiniteGuard("stop", [optimizer], logging.getLogger("test"))
    assert guard.deferred
    nan = torch.tensor(float("nan"))
    assert guard.before_optimizer_step(4, torch.tensor(1.0), nan)  # no read, no raise yet
    optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(NonFiniteError, match=r"grad_norm \(nan\) at step 4"):
        guard.resolve()
    # A finite step updates as usual.
    guard.before_optimizer_step(5, torch.tensor(1.0), torch.tensor(2.0))
    optimizer.step()
    guard.resolve()
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_guard_skip_policy_logs_the_step(caplog):
    _, optimizer = _fused_model_and_optimizer()
    guard = NonFiniteGuard("skip", [optimizer], logging.getLogger("test"))
    guard.before_optimizer_step(3, torch.tensor(float("inf")), torch.tensor(1.0))
    with caplog.at_level(logging.WARNING):
        guard.resolve()
    assert "step 3 skipped: non-finite loss inf" in caplog.text


def test_guard_reads_at_once_with_unfused_optimizers():
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    guard = NonFiniteGuard("skip", [optimizer], logging.getLogger("test"))
    assert not guard.deferred
    assert not guard.before_optimizer_step(2, torch.tensor(float("nan")), torch.tensor(1.0))
    assert guard.before_optimizer_step(3, torch.tensor(1.0), torch.tensor(1.0))


def test_guard_waits_only_when_asked(monkeypatch):
    from torchtitan.observability import numerics

    _, optimizer = _fused_model_and_optimizer()
    guard = NonFiniteGuard("stop", [optimizer], logging.getLogger("test"))
    guard.before_optimizer_step(6, torch.tensor(1.0), torch.tensor(float("nan")))
    monkeypatch.setattr(numerics._Pending, "ready", lambda self: False)  # still on its way
    guard.resolve()  # does not wait for it
    with pytest.raises(NonFiniteError, match="at step 6"):
        guard.resolve(wait=True)
