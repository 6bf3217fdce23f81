"""Read every rank's Flight Recorder dump and say which rank stopped where.

    python -m torchtitan.observability.hang_report OUTPUTS/comm_traces

The first line names the culprit; the lines after it give the evidence. What is compared, per
process group: each rank's collectives by sequence number (the n-th collective a rank issued on
that group). Findings, most decisive first:

1. **mismatch** -- at the same sequence number ranks called different collectives, or the same one
   with different shapes/dtypes ("rank 1 called all_gather float32[1] where rank 0 called
   all_reduce float32[1024] at #7 of pg 'default_pg' [0, 1]"). The odd rank out is the majority's
   minority; with a tie, the rank whose call breaks the pattern of the earlier steps.
2. **missing** -- a rank of the job left no dump: it probably died (crash, OOM kill, SIGKILL).
3. **behind** -- on some group a rank's last collective is older than its peers' ("rank 1 is
   behind: rank 0 reached all_reduce #12 (...) but rank 1 stopped at #11"). Ranks that are
   themselves waiting in a collective their peers never joined are victims, not culprits.

Point-to-point ops (pipeline send/recv) are not compared. Works on dumps from
``flight_recorder.dump`` (gloo or NCCL), NCCL watchdog dumps and raw ``_dump_fr_trace`` pickles.
"""

from __future__ import annotations

import argparse
import pickle
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from torchtitan.observability.fr_dumps import (
    Call,
    Group,
    _call,
    _key,
    _parse_ranks,
    _ranks,
    load_dumps,
)

_MAX_HISTORY = 2000  # entries looked at when predicting the expected op of a tie
_MAX_CONTEXT = 64


# --------------------------------------------------------------------------- analysis


@dataclass
class _View:
    """All ranks' collectives, per process group."""

    dumps: dict[int, dict]
    groups: dict[str, Group] = field(default_factory=dict)
    # pg -> rank -> seq -> calls at that seq (several for a coalesced group)
    calls: dict[str, dict[int, dict[int, list[Call]]]] = field(default_factory=dict)
    world: set[int] = field(default_factory=set)
    streams: dict[int, list[Call]] = field(default_factory=dict)  # rank -> calls, issue order

    @classmethod
    def build(cls, dumps: dict[int, dict], world_size: int | None) -> _View:
        view = cls(dumps)
        view.world = set(dumps)
        if world_size:
            view.world |= set(range(world_size))
        for rank, d in dumps.items():
            meta = d.get("torchtitan") or {}
            if meta.get("world_size"):
                view.world |= set(range(int(meta["world_size"])))
            own: dict[str, list[int]] = {}  # this rank's groups: name -> ranks
            for name, cfg in (d.get("pg_config") or {}).items():
                ranks = _parse_ranks(cfg.get("ranks", ""))
                if name and ranks:
                    own[str(name)] = ranks
                    key = _key(str(name), ranks)
                    group = view.groups.setdefault(key, Group(str(name), ranks=ranks, key=key))
                    group.desc = group.desc or str(cfg.get("desc", ""))
            for entry in d.get("entries") or []:
                if entry.get("is_p2p"):
                    continue
                name, desc = (list(entry.get("process_group") or ("", "")) + ["", ""])[:2]
                key = _key(str(name), own.get(str(name)))
                call = _call(rank, entry, key)
                group = view.groups.setdefault(key, Group(str(name), str(desc), key=key))
                group.desc = group.desc or str(desc)
                by_rank = view.calls.setdefault(key, {}).setdefault(rank, {})
                by_rank.setdefault(call.seq, []).append(call)
                view.streams.setdefault(rank, []).append(call)
        for key, group in view.groups.items():
            if not group.ranks:  # raw gloo dump: pg_config is empty; members = who recorded it
                group.ranks = sorted(view.calls.get(key, {}))
            view.world |= set(group.ranks)
        for stream in view.streams.values():
            stream.sort(key=lambda c: c.order)
        return view

    def evicted(self, rank: int) -> bool:
        """True if the rank's ring buffer was full (old entries were overwritten)."""
        d = self.dumps[rank]
        size = (d.get("torchtitan") or {}).get("buffer_size")
        return bool(size) and len(d.get("entries") or []) >= int(size)

    def last_seq(self, pg: str, rank: int) -> int | None:
        """The rank's last sequence number on the group; None if it cannot be known."""
        seqs = self.calls.get(pg, {}).get(rank)
        if seqs:
            return max(seqs)
        return None if self.evicted(rank) else 0

    def signature(self, pg: str, rank: int, seq: int) -> tuple:
        return tuple(c.signature for c in self.calls[pg][rank][seq])

    def call(self, pg: str, rank: int, seq: int) -> Call | None:
        found = self.calls.get(pg, {}).get(rank, {}).get(seq)
        return found[0] if found else None


@dataclass
class Finding:
    kind: str  # mismatch | missing | behind | none
    culprits: list[int]
    lines: list[str]
    when_ns: int = 0


def _predict(history: list[tuple]) -> tuple | None:
    """The op expected after ``history``: what followed the longest earlier match of its end."""
    history = history[-_MAX_HISTORY:]
    n, best_len, best = len(history), 0, None
    for j in range(n - 1, 0, -1):
        length = 0
        while length < min(j, _MAX_CONTEXT) and history[j - 1 - length] == history[n - 1 - length]:
            length += 1
        if length > best_len:
            best_len, best = length, history[j]
    return best


def _mismatches(view: _View) -> list[Finding]:
    found = []
    for pg, by_rank in view.calls.items():
        group = view.groups[pg]
        present = [r for r in group.ranks if r in by_rank]
        if len(present) < 2:
            continue
        common = sorted(set.intersection(*(set(by_rank[r]) for r in present)))
        for i, seq in enumerate(common):
            buckets: dict[tuple, list[int]] = defaultdict(list)
            for r in present:
                buckets[view.signature(pg, r, seq)].append(r)
            if len(buckets) == 1:
                continue
            found.append(_explain_mismatch(view, group, seq, common[:i], present, buckets))
            break
    return found


def _explain_mismatch(view, group, seq, before, present, buckets) -> Finding:
    pg = group.key
    ordered = sorted(buckets.items(), key=lambda kv: (-len(kv[1]), kv[1]))
    expected = None
    tie = len(ordered[0][1]) == len(ordered[1][1])
    if not tie:
        expected = ordered[0][0]
    else:  # which call breaks the pattern of the earlier collectives?
        history = [view.signature(pg, present[0], s) for s in before]
        predicted = _predict(history)
        if predicted in buckets:
            expected = predicted
    when = min(view.call(pg, r, seq).created_ns for r in present)
    calls = {r: view.call(pg, r, seq) for r in present}
    lines = []
    if expected is None:
        parts = [f"{_ranks(rs)} called {calls[rs[0]].describe()}" for _, rs in ordered]
        first = f"{_ranks(present)} disagree at #{seq} of {group.label()}: " + "; ".join(parts)
        return Finding("mismatch", sorted(present), [first, *_where(calls)], when)
    good = buckets[expected]
    culprits = sorted(r for sig, rs in buckets.items() if sig != expected for r in rs)
    for sig, rs in ordered:
        if sig == expected:
            continue
        lines.append(
            f"{_ranks(rs)} called {calls[rs[0]].describe()} where {_ranks(good)} called "
            f"{calls[good[0]].describe()} at #{seq} of {group.label()}"
        )
    if tie:
        lines.append(
            f"  ({_ranks(good)}: {calls[good[0]].describe()} is what the pattern of the earlier "
            f"collectives on this group predicts at #{seq})"
        )
    return Finding("mismatch", culprits, lines + _where(calls), when)


def _where(calls: dict[int, Call]) -> list[str]:
    return [
        f"  rank {r}: {c.describe()} #{c.seq} from {c.where}" for r, c in calls.items() if c.where
    ]


def _missing(view: _View) -> list[Finding]:
    missing = sorted(view.world - set(view.dumps))
    if not missing:
        return []
    first = f"no dump from {_ranks(missing)} — it may have died (crash, OOM kill, SIGKILL)"
    if len(missing) > 1:
        first = f"no dump from {_ranks(missing)} — they may have died (crash, OOM kill, SIGKILL)"
    lines = [first]
    for pg, by_rank in view.calls.items():
        group = view.groups[pg]
        if not set(missing) & set(group.ranks):
            continue
        waiting = [r for r in group.ranks if r in by_rank and _pending(view, pg, r)]
        if waiting:
            r = waiting[0]
            c = view.call(pg, r, max(by_rank[r]))
            lines.append(
                f"  {_ranks(waiting)} wait in {c.op} #{c.seq} of {group.label()} ({c.shapes})"
            )
    return [Finding("missing", missing, lines)]


def _pending(view: _View, pg: str, rank: int) -> bool:
    """True unless the dump says the rank's last call on ``pg`` completed."""
    seq = view.last_seq(pg, rank)
    c = view.call(pg, rank, seq) if seq else None
    return c is not None and c.done is not True


def _behind(view: _View) -> list[Finding]:
    lagging: dict[int, list[tuple[str, int, int]]] = defaultdict(list)  # rank -> (pg, last, top)
    waiting: set[int] = set()
    for pg, group in view.groups.items():
        last = {r: view.last_seq(pg, r) for r in group.ranks if r in view.dumps}
        last = {r: s for r, s in last.items() if s is not None}
        if len(last) < 2:
            continue
        top, low = max(last.values()), min(last.values())
        if top == low:
            continue
        for r, s in last.items():
            if s < top:
                lagging[r].append((pg, s, top))
            if s > low:
                waiting.add(r)
    if not lagging:
        return []
    # A rank waiting in a collective its peers never joined is a victim. If every lagging rank
    # waits (a cycle across groups), blame the ones whose last call breaks their own pattern.
    culprits = sorted(set(lagging) - waiting)
    if not culprits:
        culprits = [r for r in sorted(lagging) if _deviates(view, r)] or sorted(lagging)
    findings = []
    for r in culprits:
        # The group where the rank's missing call was issued first by a peer.
        options = []
        for pg, s, top in lagging[r]:
            ahead = [p for p in view.groups[pg].ranks if view.last_seq(pg, p) == top]
            nxt = min(
                (c for p in ahead if (c := view.call(pg, p, s + 1)) is not None),
                key=lambda c: c.created_ns,
                default=None,
            )
            options.append((nxt.created_ns if nxt else 0, pg, s, top, ahead, nxt))
        when, pg, s, top, ahead, nxt = min(options, key=lambda o: o[0])
        group = view.groups[pg]
        reached = f"{nxt.op} #{s + 1} ({group.label()}, {nxt.shapes})" if nxt else f"#{top}"
        mine = view.call(pg, r, s)
        stopped = f"#{s}" + (f" ({mine.describe()})" if mine else "")
        line = f"rank {r} is behind: {_ranks(ahead)} reached {reached} but rank {r} stopped at "
        line += stopped
        if top > s + 1:
            line += f"; {_ranks(ahead)} went on to #{top}"
        lines = [line]
        if mine and mine.where:
            lines.append(f"  rank {r}'s last collective on this group came from {mine.where}")
        if nxt and nxt.where:
            lines.append(f"  {_ranks(ahead)} issued #{s + 1} from {nxt.where}")
        findings.append(Finding("behind", [r], lines, when))
    return findings


def _deviates(view: _View, rank: int) -> bool:
    """True if the rank's last collective is not what its earlier ones predict."""
    groups = view.groups
    stream = [
        (groups[c.pg].desc or groups[c.pg].name, c.op, c.shapes) for c in view.streams.get(rank, [])
    ]
    if len(stream) < 3:
        return False
    predicted = _predict(stream[:-1])
    return predicted is not None and predicted != stream[-1]


def analyze(dumps: dict[int, dict], world_size: int | None = None) -> list[str]:
    """The report's lines; the first names the culprit."""
    if not dumps:
        return ["no Flight Recorder dumps found"]
    view = _View.build(dumps, world_size)
    mismatches = sorted(_mismatches(view), key=lambda f: f.when_ns)
    findings = mismatches + _missing(view) + sorted(_behind(view), key=lambda f: f.when_ns)
    lines = [line for f in findings for line in f.lines]
    if not findings:
        lines.append(_no_desync(view))
    return lines + _summary(view)


def _no_desync(view: _View) -> str:
    parts = []
    for pg, by_rank in view.calls.items():
        seqs = {view.last_seq(pg, r) for r in by_rank}
        if len(seqs) == 1 and (seq := seqs.pop()):
            c = view.call(pg, next(iter(by_rank)), seq)
            state = "pending" if any(_pending(view, pg, r) for r in by_rank) else "completed"
            parts.append(f"{c.op} #{seq} of {view.groups[pg].label()} ({state})")
    where = "; ".join(parts[:4]) or "no collectives recorded"
    return (
        f"no desync found: all ranks' last collectives agree: {where} — a slow rank outside "
        "collectives, the network, or a hang not in a collective?"
    )


def _summary(view: _View) -> list[str]:
    lines = [
        f"read {len(view.dumps)} dump(s) for a world of {len(view.world)}, "
        f"{len(view.groups)} process group(s)"
    ]
    for r in sorted(view.dumps):
        reason = (view.dumps[r].get("torchtitan") or {}).get("reason")
        if reason:
            # gloo prefixes its errors with the C++ source location: "[/path/pair.cc:78] ..."
            reason = re.sub(r"\[[^\]]*\.(cc|cpp|h|hpp):\d+\] ", "", reason)
            lines.append(f"  rank {r} dumped on {reason}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torchtitan.observability.hang_report",
        description="Name the rank that stopped, from every rank's Flight Recorder dump.",
    )
    parser.add_argument("folder", help="folder with the rank_<r> dumps (job's comm_traces)")
    parser.add_argument("-p", "--prefix", default="rank_", help="dump file prefix (rank_)")
    parser.add_argument("-w", "--world-size", type=int, default=None, help="ranks in the job")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    if not folder.is_dir():
        print(f"error: {folder} is not a folder", file=sys.stderr)
        return 2
    try:
        dumps = load_dumps(folder, args.prefix)
    except (OSError, pickle.UnpicklingError, EOFError) as e:
        print(f"error: cannot read a dump in {folder}: {e}", file=sys.stderr)
        return 2
    if not dumps:
        print(f"no {args.prefix}<rank> dumps in {folder}", file=sys.stderr)
        return 1
    print("\n".join(analyze(dumps, args.world_size)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
