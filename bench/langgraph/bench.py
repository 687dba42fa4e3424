#!/usr/bin/env python3
"""The workload of `keel bench`, written for LangGraph, and its crash-and-resume counterpart.

Workload (node/src/run/bench.rs): a coordinator node writes a plan of N steps; N specialists are fanned
out with `Send` in one superstep; each returns at once a ~300-byte sourced report (the same bytes keel's
instant harness answers with); a synthesis node parses and merges the reports. A fresh thread per run.

Durable modes:
- `sync`: LangGraph's SQLite checkpointer with `durability="sync"` (every superstep's checkpoint and
  every task's writes are in SQLite before the next step starts). Sequential runs use `SqliteSaver` and
  `invoke`; runs in flight use `AsyncSqliteSaver` and `ainvoke` under asyncio, because `SqliteSaver`'s
  own documentation says it "does not scale to multiple threads" and points to `AsyncSqliteSaver`.
  SQLite runs in WAL mode (the saver's setup) with Python's default `synchronous=FULL`, so a commit
  is fsynced.
- `none`: no checkpointer at all, the floor (sequential `invoke`, in flight `ainvoke`).

Subcommands:
  throughput  runs/s, µs per specialist and bytes stored per run, as JSON lines
  crash       SIGKILL a run mid-superstep, resume it from the checkpointer, count re-executions
(`crash-child` is what `crash` starts; not for humans.)

The data directory must be on the disk under test; this program does not check the file system
(scripts/bench-vs-langgraph does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

import aiosqlite


def report(task: str) -> str:
    """The report keel's instant harness answers with (node/src/run/bench.rs `report`), byte for byte."""
    return (
        '{"subtask_id":"' + task + '","status":"complete","findings":[{"claim":"the instant harness '
        "answered this part at once with a fixed finding that is long enough to weigh what a short real "
        'report weighs","source":"bench","confidence_permille":900}],"gaps":[],"summary":"done"}'
    )


class RunState(TypedDict, total=False):
    """A run: the brief, the plan, the specialists' reports (appended), the synthesis."""

    brief: str
    n: int
    steps: list[dict]
    reports: Annotated[list[str], operator.add]
    synthesis: str


class Step(TypedDict):
    """What `Send` hands one specialist: its step of the plan."""

    key: str
    brief: str


def coordinator(state: RunState) -> dict:
    """Plan N steps (the plan keel bench submits: `part-000`.. with a one-line brief each)."""
    return {"steps": [{"key": f"part-{i:03}", "brief": f"Part {i}."} for i in range(state["n"])]}


def fan_out(state: RunState) -> list[Send]:
    """Every step to a specialist, all in one superstep."""
    return [Send("specialist", step) for step in state["steps"]]


def synthesis(state: RunState) -> dict:
    """Parse every report and merge their findings into one text."""
    lines = []
    for text in sorted(state["reports"]):
        r = json.loads(text)
        if r["status"] != "complete":
            raise ValueError(f"a report is not complete: {text}")
        for f in r["findings"]:
            lines.append(f"{r['subtask_id']}: {f['claim']} ({f['source']})")
    return {"synthesis": "\n".join(lines)}


def specialist(step: Step) -> dict:
    """Answer at once with the report."""
    return {"reports": [report(step["key"])]}


async def specialist_async(step: Step) -> dict:
    """The same specialist for `ainvoke` (an async node runs on the event loop, not a thread)."""
    return {"reports": [report(step["key"])]}


async def coordinator_async(state: RunState) -> dict:
    return coordinator(state)


async def synthesis_async(state: RunState) -> dict:
    return synthesis(state)


def build(checkpointer=None, asynchronous: bool = False, specialist_fn=None):
    """The graph: START → coordinator → (Send × N) specialist → synthesis → END."""
    g = StateGraph(RunState)
    g.add_node("coordinator", coordinator_async if asynchronous else coordinator)
    g.add_node("specialist", specialist_fn or (specialist_async if asynchronous else specialist))
    g.add_node("synthesis", synthesis_async if asynchronous else synthesis)
    g.add_edge(START, "coordinator")
    g.add_conditional_edges("coordinator", fan_out, ["specialist"])
    g.add_edge("specialist", "synthesis")
    g.add_edge("synthesis", END)
    return g.compile(checkpointer=checkpointer)


def check(out: dict, n: int) -> None:
    if len(out.get("reports", [])) != n or out.get("synthesis", "").count("\n") != n - 1:
        raise RuntimeError(f"a run did not merge {n} reports: {out!r:.200}")


def db_bytes(path: Path) -> int:
    """The database's size on disk: the file plus its write-ahead log, if one is left."""
    total = 0
    for p in (path, Path(f"{path}-wal")):
        if p.exists():
            total += p.stat().st_size
    return total


def fresh_db(data: Path, label: str) -> Path:
    path = data / f"langgraph-{label}-{uuid.uuid4().hex[:8]}.sqlite"
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        p.unlink(missing_ok=True)
    return path


def remove_db(path: Path) -> None:
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        p.unlink(missing_ok=True)


def run_input(n: int) -> dict:
    return {"brief": "bench", "n": n, "reports": []}


def config() -> dict:
    return {"configurable": {"thread_id": str(uuid.uuid4())}}


def cpu_seconds() -> float:
    """The CPU time this process has used so far, user and system, over all its threads (aiosqlite's
    and the checkpointer's included), as keel bench measures its own."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sequential(n: int, runs: int, mode: str, data: Path) -> tuple[float, float | None, float]:
    """Seconds for `runs` runs one after the other, bytes stored per run (None without a store), and
    the CPU seconds they took."""
    if mode == "none":
        graph = build()
        cpu = cpu_seconds()
        started = time.perf_counter()
        for _ in range(runs):
            check(graph.invoke(run_input(n), config()), n)
        return time.perf_counter() - started, None, cpu_seconds() - cpu
    path = fresh_db(data, "seq")
    try:
        conn = sqlite3.connect(str(path), check_same_thread=False)
        saver = SqliteSaver(conn)
        saver.setup()
        conn.commit()
        graph = build(saver)
        empty = db_bytes(path)
        cpu = cpu_seconds()
        started = time.perf_counter()
        for _ in range(runs):
            check(graph.invoke(run_input(n), config(), durability="sync"), n)
        secs = time.perf_counter() - started
        cpu = cpu_seconds() - cpu
        conn.close()  # The last connection checkpoints the WAL into the file.
        return secs, (db_bytes(path) - empty) / runs, cpu
    finally:
        remove_db(path)


async def in_flight(n: int, runs: int, flight: int, mode: str, data: Path) -> tuple[float, float | None, float]:
    """Seconds for `runs` runs with at most `flight` at once (asyncio), bytes stored per run, and the
    CPU seconds they took."""
    gate = asyncio.Semaphore(flight)

    async def one(graph, durable: bool) -> None:
        async with gate:
            if durable:
                out = await graph.ainvoke(run_input(n), config(), durability="sync")
            else:
                out = await graph.ainvoke(run_input(n), config())
            check(out, n)

    if mode == "none":
        graph = build(asynchronous=True)
        cpu = cpu_seconds()
        started = time.perf_counter()
        await asyncio.gather(*(one(graph, False) for _ in range(runs)))
        return time.perf_counter() - started, None, cpu_seconds() - cpu
    path = fresh_db(data, "flight")
    try:
        async with aiosqlite.connect(str(path)) as conn:
            saver = AsyncSqliteSaver(conn)
            await saver.setup()
            graph = build(saver, asynchronous=True)
            empty = db_bytes(path)
            cpu = cpu_seconds()
            started = time.perf_counter()
            await asyncio.gather(*(one(graph, True) for _ in range(runs)))
            secs = time.perf_counter() - started
            cpu = cpu_seconds() - cpu
        return secs, (db_bytes(path) - empty) / runs, cpu
    finally:
        remove_db(path)


def throughput(args: argparse.Namespace) -> None:
    data = Path(args.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    for n in args.fan_out:
        for mode in args.modes:
            # A warm-up per shape, not measured (as keel bench does).
            sequential(n, 2, mode, data)
            for flight in (1, args.in_flight):
                if flight == 1:
                    secs, per_run, cpu = sequential(n, args.runs, mode, data)
                else:
                    secs, per_run, cpu = asyncio.run(in_flight(n, args.runs, flight, mode, data))
                print(
                    json.dumps(
                        {
                            "system": "langgraph",
                            "mode": mode,
                            "specialists": n,
                            "in_flight": flight,
                            "runs": args.runs,
                            "runs_per_s": args.runs / secs,
                            "us_per_specialist": secs * 1e6 / (args.runs * n),
                            "cpu_us_per_specialist": cpu * 1e6 / (args.runs * n),
                            "bytes_per_run": per_run,
                        }
                    ),
                    flush=True,
                )


# --- Crash and resume -------------------------------------------------------------------------------
#
# The same shape with specialists that do timed work, as tests/tests/run_crash.rs gives keel: 16 parts,
# at most 8 at once, each 0.2 s and the last 1.5 s. Each specialist appends `start i` to a log before
# its work and `done i` after it (before it returns its report). The parent kills the child with
# SIGKILL once `kill_after` parts are done, reads which results the checkpointer holds durably for the
# interrupted superstep (its pending writes), resumes the thread from the checkpointer in a new process
# (`invoke(None, config)`), and counts from the log which parts ran again.


def timed_specialist(log: Path, parts: int):
    def run(step: Step) -> dict:
        i = int(step["key"].split("-")[1])
        with open(log, "a") as f:
            f.write(f"start {i}\n")
        time.sleep(1.5 if i == parts - 1 else 0.2)
        with open(log, "a") as f:
            f.write(f"done {i}\n")
        return {"reports": [report(step["key"])]}

    return run


def crash_child(args: argparse.Namespace) -> None:
    conn = sqlite3.connect(args.db, check_same_thread=False)
    graph = build(SqliteSaver(conn), specialist_fn=timed_specialist(Path(args.log), args.parts))
    cfg = {"configurable": {"thread_id": args.thread}, "max_concurrency": args.concurrency}
    out = graph.invoke(None if args.resume else run_input(args.parts), cfg, durability="sync")
    check(out, args.parts)
    print(json.dumps({"reports": len(out["reports"])}), flush=True)


def log_parts(log: Path, what: str, skip: int = 0) -> list[int]:
    if not log.exists():
        return []
    lines = log.read_text().splitlines()[skip:]
    return [int(l.split()[1]) for l in lines if l.startswith(what + " ")]


def durable_parts(db: str, thread: str) -> list[int]:
    """The parts whose report the checkpointer holds for the run's latest checkpoint."""
    conn = sqlite3.connect(db, check_same_thread=False)
    try:
        saver = SqliteSaver(conn)
        tup = saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
        parts = []
        for _task, channel, value in (tup.pending_writes or []) if tup else []:
            if channel == "reports":
                for r in value:
                    parts.append(int(json.loads(r)["subtask_id"].split("-")[1]))
        return sorted(parts)
    finally:
        conn.close()


def child(args: argparse.Namespace, db: Path, log: Path, thread: str, resume: bool) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "crash-child", "--db", str(db), "--log", str(log), "--thread",
           thread, "--parts", str(args.parts), "--concurrency", str(args.concurrency)]
    if resume:
        cmd.append("--resume")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def crash(args: argparse.Namespace) -> None:
    data = Path(args.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    for kill_after in args.kill_after:
        db = fresh_db(data, "crash")
        log = data / f"crash-{uuid.uuid4().hex[:8]}.log"
        thread = str(uuid.uuid4())
        try:
            proc = child(args, db, log, thread, resume=False)
            deadline = time.monotonic() + 120
            while len(log_parts(log, "done")) < kill_after:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the run ended or stalled before {kill_after} parts were done: "
                                       f"{proc.stderr.read() if proc.stderr else ''}")
                time.sleep(0.002)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            done_at_kill = sorted(set(log_parts(log, "done")))
            lines_at_kill = len(log.read_text().splitlines())
            durable = durable_parts(str(db), thread)
            resumed = child(args, db, log, thread, resume=True)
            out, err = resumed.communicate(timeout=300)
            if resumed.returncode != 0:
                raise RuntimeError(f"the resume failed: {err}")
            rerun = sorted(set(log_parts(log, "start", skip=lines_at_kill)))
            print(json.dumps({
                "system": "langgraph",
                "parts": args.parts,
                "kill_after_done": kill_after,
                "done_at_kill": len(done_at_kill),
                "durable_at_kill": len(durable),
                "rerun": len(rerun),
                "rerun_done_at_kill": len(set(rerun) & set(done_at_kill)),
                "rerun_durable_at_kill": len(set(rerun) & set(durable)),
                "completed": json.loads(out.strip().splitlines()[-1])["reports"] == args.parts,
            }), flush=True)
        finally:
            remove_db(db)
            log.unlink(missing_ok=True)


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("throughput", help="runs/s, µs per specialist, bytes stored per run (JSON lines)")
    t.add_argument("--fan-out", type=numbers, default=[1, 4, 16, 64], help="specialists per run, comma-separated")
    t.add_argument("--runs", type=int, default=50, help="runs per measurement")
    t.add_argument("--in-flight", type=int, default=8, help="runs at once for the concurrent measurement")
    t.add_argument("--modes", type=lambda s: s.split(","), default=["sync", "none"], help="sync,none")
    t.add_argument("--data-dir", required=True, help="where the SQLite files go (a real disk)")
    c = sub.add_parser("crash", help="SIGKILL mid-superstep, resume, count re-executed specialists")
    c.add_argument("--kill-after", type=numbers, default=[1, 8, 15], help="kill once this many parts are done")
    c.add_argument("--parts", type=int, default=16)
    c.add_argument("--concurrency", type=int, default=8, help="LangGraph's max_concurrency")
    c.add_argument("--data-dir", required=True)
    k = sub.add_parser("crash-child")
    k.add_argument("--db", required=True)
    k.add_argument("--log", required=True)
    k.add_argument("--thread", required=True)
    k.add_argument("--parts", type=int, required=True)
    k.add_argument("--concurrency", type=int, required=True)
    k.add_argument("--resume", action="store_true")
    args = p.parse_args()
    {"throughput": throughput, "crash": crash, "crash-child": crash_child}[args.command](args)


if __name__ == "__main__":
    main()
