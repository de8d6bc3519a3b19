"""PyTorch profiler (Kineto) Chrome-trace JSON, one file per rank (.json or .json.gz).

DuckDB parses each file straight into typed columns (events.py; no Python loop per event); the linking of kernels
to the CPU ops that launched them and the steps (link.py), and the process groups, are SQL over those columns. Each
file is read on its own (:func:`parse_file`, in a worker process with --jobs), its per-event tables spilled as
Parquet beside the store; only what needs every file (ranks, host clocks, groups) runs over the small parts the
files give back (:func:`_run`).

GPU runs: device events are `kernel`, `gpu_memcpy`, `gpu_memset` in today's spelling (events._CATEGORY maps every
vintage's and accelerator's categories onto them: 2021's `Kernel`, MTIA's `mtia_ccp_events`, ...). A communication
kernel's op comes, in order, from its own args (`Collective name`, pg-args), from the CPU op that launched it
(runtime correlation, then the innermost enclosing `record_param_comms` / `nccl:*` / `c10d::*` op on the launching
thread, cpu-op), else from its name (name-rule). CPU-only runs (gloo) have no device events: see
:mod:`traceana.ingest.kineto.cpu`.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass, replace
from pathlib import Path

import duckdb
import polars as pl

from traceana.errors import TraceanaError
from traceana.ingest.clocks import require_overlapping_clocks
from traceana.ingest.dispatch import IngestOptions
from traceana.ingest.kineto.events import EVENT_TABLE, FIRST_INPUT_NELEMS, KINETO_CATEGORIES, load, trace_files
from traceana.ingest.kineto.link import device_frames, device_steps
from traceana.ingest.kineto.syncs import file_syncs
from traceana.ingest.parallel.executor import from_ipc, map_files, threads_per_task, to_ipc, worker_count
from traceana.ingest.parallel.spill import Spill, new_spill, spill_file
from traceana.ingest.ranks import rank_in_file_name, require_distinct, require_unique_ranks
from traceana.ingest.rules import Rule
from traceana.ingest.run_data import SCHEMAS, RunData
from traceana.ingest.scopes import SWEEP_CONFIG
from traceana.ingest.step_windows import StepLinks
from traceana.ingest.syncs.edges import SyncCounts
from traceana.ingest.validate import Dropped, rank_list


def matches(path: Path) -> bool:
    """A Kineto trace, or a folder of them: JSON whose first bytes open an object (Ascend timelines are arrays)."""
    files = trace_files(path)
    if not files:
        return False
    import gzip

    try:
        opener = gzip.open if files[0].name.endswith(".gz") else open
        with opener(files[0], "rb") as handle:
            head = handle.read(4096).lstrip()
    except (OSError, EOFError):
        return path.is_file()  # a broken .json(.gz) file: let read() name the problem
    return head.startswith(b"{") or not head


_DEVICE = "cat IN ('kernel', 'gpu_memcpy', 'gpu_memset')"
# Host-side detail Kineto writes that is no device work, so no note counts it (python frames, of which the
# nn.Module ranges are kept, CUPTI overhead, the profiler's own span).
_HOST_DETAIL = ("python_function", "cpu_instant_event", "overhead", "trace")
# The annotations: the host's ranges (CPU ops, user ranges, the Python tracer's nn.Module ranges) on their thread,
# so exports can draw each thread's op tree; a CPU op with its External id (args op_id: event_ops.op_id of the
# kernels it launched). gpu_user_annotation ranges lie on a device stream: no thread.
_HOST_RANGES_SQL = """SELECT f, start_ns, end_ns, name, 'cpu' AS domain, cat AS kind,
    CASE WHEN cat = 'cpu_op' AND ext_id IS NOT NULL THEN json_object('op_id', ext_id)::VARCHAR END AS args,
    CASE WHEN cat <> 'gpu_user_annotation' THEN TRY_CAST(tid AS BIGINT) END AS thread
FROM ev WHERE cat IN ('user_annotation', 'gpu_user_annotation', 'cpu_op')
    OR (cat = 'python_function' AND starts_with(name, 'nn.Module: '))"""


@dataclass
class ParsedFile:
    """What reading one file gives back to the run: everything but its bulky tables, which went to the spill
    folder as part ``key`` (:func:`spill.spill_file`). Times are the file's own clock."""

    info: dict  # distributedInfo, checked
    device_names: list[str]  # the device names deviceProperties lists
    key: str
    span: tuple[int, int] | None  # first and last ns of any event: files of one run overlap
    seen_groups: list[tuple[str, str | None, str]]  # (name, description, ranks) that kernel args state
    samples: pl.DataFrame  # first communication events (name, end_ns, n, k): the coarse host clock alignment
    collectives: pl.DataFrame  # raw collective rows (op decided, group by name) with their event's stream and times
    steps: pl.DataFrame
    links: StepLinks
    unnumbered: int  # ProfilerStep ranges whose number does not fit an INTEGER
    dropped: Dropped  # what validation left out of this file's rows
    sync_counts: SyncCounts  # sync calls left out, syncs whose waited event is unknown
    whole: bytes | None  # a file without device events: all its rows (Arrow IPC), for a CPU-only run
    vintage: str  # which Kineto wrote it (events.Loaded)
    categories: list[tuple[str, bool, int]]  # (category, read as device work?, events) beyond Kineto's own: a note
    host_comm: list[tuple[str, int]]  # the process groups' collective calls on the host (nccl:all_reduce), by name
    unphased: int = 0  # events left out: no Trace Event Format phase (events.Loaded)


def parse_file(file: Path, *, rules: list[Rule], spill: Path, threads: int = 1) -> ParsedFile:
    """Everything about one file that needs no other file (run in a worker process, or in-process for --jobs 1):
    parse, link kernels to their launches, the rank's step windows, validation; device events, annotations and
    memory samples are written to ``spill``, the rest comes back. Rows carry rank 0 until the run knows ranks."""
    con = duckdb.connect(config={"threads": threads, **SWEEP_CONFIG})
    con.execute("SET enable_progress_bar = false")  # a worker's bar would garble the CLI's
    con.execute(EVENT_TABLE)
    info, device_names, vintage, unphased = load(con, file, 0)
    span = con.execute("SELECT min(start_ns), max(end_ns) FROM ev").fetchall()[0]
    seen = con.execute("SELECT DISTINCT pg_name, pg_desc, pg_ranks FROM ev "
                       "WHERE pg_name IS NOT NULL AND pg_ranks IS NOT NULL").fetchall()
    devices = con.execute(f"SELECT count(*) FROM ev WHERE {_DEVICE}").fetchall()[0][0]
    events, comm = device_frames(con, rules)
    steps, links, unnumbered = device_steps(con)
    syncs, sync_counts = file_syncs(con, events)
    frames, key, dropped = spill_file(spill, "kineto", str(file), {
        "device_events": events.rename({"f": "rank"}), "steps": steps.rename({"f": "rank"}), "syncs": syncs,
        "memory": con.sql("SELECT 0 AS rank, start_ns AS ts_ns, mem_allocated AS allocated_bytes, mem_reserved AS "
                          "reserved_bytes FROM ev WHERE name = '[memory]' AND mem_device_type = 1").pl(),
        "annotations": con.sql(_HOST_RANGES_SQL).pl().rename({"f": "rank"}),
        "event_ops": events.filter(pl.col("op_id").is_not_null() & pl.col("launch_op").is_not_null()).select(
            pl.col("f").alias("rank"), "event_id", "op_id", pl.col("launch_op").alias("op"), "input_dims",
            "input_types", "concrete_inputs"),
        "event_scopes": events.filter(pl.any_horizontal(pl.col("scope_op", "module").is_not_null())).select(
            pl.col("f").alias("rank"), "event_id", pl.col("scope_op").alias("op"), "module", "phase")})
    kept = frames["device_events"].select(pl.col("rank").alias("f"), "event_id")
    comm = comm.join(kept, on=["f", "event_id"], how="semi").select(
        *[c for c in SCHEMAS["collectives"] if c in comm.columns and c not in ("rank", "pg")], "f", "pg_name",
        "group_size", "stream", "start_ns", "end_ns")
    return ParsedFile(info, device_names, key, span if span[0] is not None else None, seen,
                      con.sql(_SAMPLES_SQL).pl(), comm, frames["steps"].rename({"rank": "f"}), links, unnumbered,
                      dropped, sync_counts.count(frames["syncs"]),
                      None if devices else to_ipc(con.sql("SELECT * FROM ev").arrow()), vintage,
                      con.execute(_OTHER_CATEGORIES_SQL).fetchall(), con.execute(_HOST_COMM_SQL).fetchall(), unphased)


# The ranges a ProcessGroup writes around each collective it runs (nccl:all_reduce, hccl:allgather, gloo:barrier).
_HOST_COMM_SQL = r"""SELECT name, count(*) FROM ev WHERE cat IN ('user_annotation', 'cpu_op')
    AND regexp_matches(name, '^[a-z]*ccl:|^gloo:') GROUP BY ALL ORDER BY ALL"""


def _silent_comm_note(parsed: list[ParsedFile], groups: pl.DataFrame) -> list[str]:
    """A device run whose host ran collectives but whose devices ran no communication kernel: say why."""
    calls: dict[str, int] = {}
    for part in parsed:
        for name, n in part.host_comm:
            calls[name] = calls.get(name, 0) + n
    if not calls:
        return []
    why = ("their process groups hold one rank each (pg_config), so there was nothing to communicate"
           if not groups.is_empty() and groups["ranks"].list.len().eq(1).all()
           else "the trace has no communication kernel (CPU collectives, or kernels the profiler did not record)")
    named = ", ".join(f"{name} {n:,}" for name, n in sorted(calls.items(), key=lambda c: -c[1])[:5])
    return [f"0 collectives: {sum(calls.values()):,} collective calls on the host ({named}) and no communication "
            f"on the device: {why}"]


# Events whose category is not one Kineto is known to write for work traceana reads (events._CATEGORY): those read
# as device work because they ran on a device, and those left out, per category as the file spells it.
_OTHER_CATEGORIES_SQL = f"""SELECT coalesce(kineto_cat, '(no cat)'), cat IS NOT DISTINCT FROM 'kernel', count(*) FROM ev
    WHERE ph = 'X' AND ((cat = 'kernel' AND coalesce(lower(kineto_cat), '')
                         NOT IN ('kernel', 'cuda_profiler_range', 'mtia_ccp_events'))
                        OR cat IS NULL OR (cat NOT IN {KINETO_CATEGORIES} AND lower(cat) NOT IN {_HOST_DETAIL}))
    GROUP BY ALL ORDER BY ALL"""


def _category_notes(parsed: list[ParsedFile]) -> list[str]:
    """What the files hold beyond the categories traceana reads: counted, never silently lost."""
    totals: dict[tuple[str, bool], int] = {}
    for part in parsed:
        for cat, device, n in part.categories:
            totals[(cat, device)] = totals.get((cat, device), 0) + n
    notes = []
    if unphased := sum(p.unphased for p in parsed):
        notes.append(f"{unphased:,} events left out: their ph is missing or no phase the Trace Event Format defines")
    for device, what in ((True, "read as device work (they ran on a device; classified by name)"),
                         (False, "left out: traceana does not read these categories")):
        counts = [f"{cat} {n:,}" for (cat, d), n in sorted(totals.items()) if d is device]
        if counts:
            notes.append(f"{sum(n for (_, d), n in totals.items() if d is device):,} events of categories Kineto "
                         f"is not known to write for device work or launches {what}: {', '.join(counts)}")
    return notes


# torch.profiler.tensorboard_trace_handler names files {worker_name}.{ms}.pt.trace.json with worker_name
# "{hostname}_{pid}" by default: the only place a Kineto trace says which host (so which clock) it came from.
_WORKER_FILE = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)\.\d+\.pt\.trace\.json(\.gz)?$")


def _host_of(file: Path) -> str | None:
    match = _WORKER_FILE.match(file.name)
    return match["host"] if match else None


def _ranks(infos: list[dict], files: list[Path]) -> tuple[list[int], list[str]]:
    """Each file's rank and how it was found: distributedInfo's rank, else one the file name states
    (ranks.rank_in_file_name), else the lowest free rank in file order, torch's default worker names
    ({host}_{pid}.{ms}.pt.trace.json) by host then pid. Other digits in a name are not ranks."""
    stated: list[tuple[int, str] | None] = []
    for info, file in zip(infos, files, strict=True):
        named = rank_in_file_name(file.name)
        stated.append((info["rank"], "distributedInfo") if isinstance(info.get("rank"), int)
                      else (named, "file-name") if named is not None else None)
    taken = {s[0] for s in stated if s is not None}
    free = (r for r in itertools.count() if r not in taken)

    def order(index: int) -> tuple[str, int]:
        worker = _WORKER_FILE.match(files[index].name)
        return (worker["host"], int(worker["pid"])) if worker else (files[index].name, -1)

    for index in sorted(range(len(files)), key=order):
        if stated[index] is None:
            stated[index] = (next(free), "file-order")
    return [s[0] for s in stated if s], [s[1] for s in stated if s]


def _require_one_job(infos: list[dict], files: list[Path], spans: list[tuple[int, int] | None]) -> None:
    """Files of one run state one world size and were recorded at overlapping times (after host alignment)."""
    sizes = [i.get("world_size") if isinstance(i.get("world_size"), int) else None for i in infos]
    stated = [s for s in sizes if s is not None]
    if len(set(stated)) > 1:
        usual = max(set(stated), key=lambda s: (stated.count(s), -stated.index(s)))
        odd = next(i for i, s in enumerate(sizes) if s not in (None, usual))
        first = next(i for i, s in enumerate(sizes) if s == usual)
        raise TraceanaError(f"{files[odd]}: from another job (world size {sizes[odd]}, {files[first].name} has "
                            f"{usual}); ingest each job as its own run")
    for file, info, size in zip(files, infos, sizes, strict=True):
        if size is not None and isinstance(info.get("rank"), int) and info["rank"] >= size:
            raise TraceanaError(f"{file}: distributedInfo states rank {info['rank']} of a world of {size} ranks "
                                f"(ranks are 0 .. {size - 1})")
    require_overlapping_clocks([(str(file), *span) for file, span in zip(files, spans, strict=True) if span])


def _process_groups(infos: list[dict], seen: list[tuple[str, str | None, str]]) -> pl.DataFrame:
    """Groups from every file's pg_config plus those only seen in kernel args (``seen``: name, description,
    members as list or string)."""
    rows = []
    for info in infos:
        for pg in info.get("pg_config") or []:
            rows.append((str(pg.get("pg_name")), pg.get("pg_desc"), pg["ranks"]))  # checked by _metadata
    for name, desc, ranks in dict.fromkeys(seen):
        rows.append((name, desc, rank_list(ranks, f"kernel args of group {name}", "Process Group Ranks")))
    unique = {(name, tuple(ranks)): desc for name, desc, ranks in rows if ranks}
    frame = pl.DataFrame(
        [{"name_key": n, "name": d if d not in (None, "undefined") else None, "ranks": list(r)}
         for (n, r), d in unique.items()],
        schema={"name_key": pl.String(), "name": pl.String(), "ranks": pl.List(pl.Int32())},
    )
    # The same pg_name with different members (torch's per-rank naming) gets a distinct id per rank set.
    frame = frame.with_columns(pl.len().over("name_key").alias("_n"))
    pg = pl.when(pl.col("_n") > 1).then(
        pl.col("name_key") + "/" + pl.col("ranks").list.first().cast(pl.String)).otherwise(pl.col("name_key"))
    return frame.with_columns(pg.alias("pg"), pl.lit("trace").alias("source")).drop("_n")


# A file's first communication events, for the coarse alignment of host clocks (_align_hosts).
_SAMPLES_SQL = f"""SELECT * FROM (
    SELECT name, end_ns, coalesce(in_nelems, {FIRST_INPUT_NELEMS}) AS n, row_number() OVER (ORDER BY start_ns) AS k
    FROM ev WHERE (cat = 'kernel' AND regexp_matches(name, '^nccl')) OR starts_with(name, 'gloo:')
) WHERE k <= 2000"""

def read(paths: list[Path], options: IngestOptions) -> RunData:
    """The run: each file read on its own (:func:`parse_file`, across ``options.jobs`` workers), then what needs
    every file (ranks, host clocks, one job, process groups) on the small parts the files gave back. A CPU-only run
    (no file has device events) is read whole (:func:`_cpu_run`)."""
    files = [f for p in paths for f in trace_files(p)]
    if not files:
        raise TraceanaError(f"{paths[0]}: no Kineto trace files (*.json, *.json.gz) here")
    require_distinct(files)
    options.progress.files(files)
    with new_spill(options.spill_near) as spill:
        workers = worker_count(options.jobs, files)
        task = functools.partial(parse_file, rules=options.rules, spill=spill.folder,
                                 threads=threads_per_task(workers))
        hosts = [_host_of(f) for f in files]
        parsed, first_of_host, rank_sets = [], {}, {}
        for index, (file, part) in enumerate(zip(files, map_files(task, files, workers), strict=True)):
            if first_of_host.setdefault(hosts[index], index) != index:  # only each host's first file serves the
                part.samples = part.samples.clear()  # clock alignment
            _share_rank_sets(part.info, rank_sets)
            parsed.append(part)
            options.progress.read(file)
        return _run(files, parsed, spill, options)


def _share_rank_sets(info: dict, known: dict[tuple[int, ...], list[int]]) -> None:
    """Point each pg_config group's ranks at one list per distinct rank set: every file lists the default group's
    every rank and its data-parallel group's, so N ranks would otherwise hold N copies of each (quadratic: 0.75 GB of
    Python ints at 4,096 ranks)."""
    for group in info.get("pg_config") or []:
        group["ranks"] = known.setdefault(tuple(group["ranks"]), group["ranks"])


def _run(files: list[Path], parsed: list[ParsedFile], spill: Spill, options: IngestOptions) -> RunData:
    """The run from its files' parts: ranks, the coarse host clock offsets (the spilled parts' first shift), one
    job, process groups; the collectives, steps and notes of every file, in file order."""
    infos = [p.info for p in parsed]
    ranks, rank_sources = _ranks(infos, files)
    require_unique_ranks(ranks, [str(f) for f in files])
    options.progress.phase("aligning clocks and classifying events")
    world = max([i.get("world_size") or 0 for i in infos] + [len(files)])
    file_rank = pl.DataFrame({"f": list(range(len(files))), "rank": ranks}, schema={"f": pl.Int32, "rank": pl.Int32})
    hosts = [_host_of(f) for f in files]
    offsets = _align_hosts([p.samples for p in parsed], hosts)
    _require_one_job(infos, files, [(p.span[0] + o, p.span[1] + o) if p.span else None
                                    for p, o in zip(parsed, offsets, strict=True)])
    groups = _process_groups(infos, [g for p in parsed for g in p.seen_groups])
    notes: list[str] = []
    ranks_frame = pl.DataFrame({"rank": ranks, "host": hosts, "clock_offset_ns": offsets,
                                "source": [str(f) for f in files], "rank_source": rank_sources})
    marker_note = [] if options.step_marker is None else [
        f"--step-marker {options.step_marker!r} ignored: Kineto steps are the profiler's ProfilerStep#N"]
    if all(p.whole is not None for p in parsed):
        spill.remove()
        data = _cpu_run(parsed, file_rank, offsets, groups, options)
        data.notes[:0] = marker_note + _category_notes(parsed)
    else:
        def tagged(frame: pl.DataFrame, index: int) -> pl.DataFrame:
            shifted = [pl.col(c) + offsets[index] for c in ("start_ns", "end_ns") if c in frame.columns]
            return frame.with_columns(pl.lit(index, pl.Int32()).alias("f"), *shifted)

        comm = pl.concat([tagged(p.collectives, i) for i, p in enumerate(parsed)], how="vertical_relaxed")
        steps = pl.concat([tagged(p.steps, i) for i, p in enumerate(parsed)], how="vertical_relaxed")
        for part in parsed:  # the run's frames hold their rows now
            part.collectives, part.steps = part.collectives.clear(), part.steps.clear()
        # A collective takes the group its pg_name names where its rank is a member (several groups may share a
        # name); membership by a join on (group, rank), not a list of members on every row (DP's 1,024 at 4,096).
        members = groups.select("pg", pl.col("ranks").alias("rank")).explode("rank").with_columns(
            pl.lit(True).alias("_member"))
        comm = comm.join(file_rank, on="f", maintain_order="left").join(
            groups.select("name_key", "pg"), left_on="pg_name", right_on="name_key", how="left", maintain_order="left"
        ).join(members, on=["pg", "rank"], how="left", maintain_order="left").filter(
            pl.col("pg").is_null() | pl.col("_member")).drop("_member").unique(
            ["rank", "event_id"], keep="first", maintain_order=True)
        links = sum((replace(p.links, unlinked=[ranks[i]] if p.links.unlinked else [])  # the worker's rank: "this"
                     for i, p in enumerate(parsed)), StepLinks())
        if unnumbered := sum(p.unnumbered for p in parsed):
            notes.append(f"{unnumbered} ProfilerStep ranges left out: their step number does not fit an INTEGER")
        notes += (links.notes() + sum((p.sync_counts for p in parsed), SyncCounts()).notes() + marker_note
                  + _category_notes(parsed) + (_silent_comm_note(parsed, groups) if comm.is_empty() else []))
        spill.parts = pl.DataFrame({"key": [p.key for p in parsed], "rank": ranks, "shift": offsets},
                                   schema=spill.parts.schema)
        data = RunData(
            source_format="kineto", sources=[], world_size=world,
            tool_version="; ".join(dict.fromkeys(p.vintage for p in parsed)), notes=notes,
            frames={"process_groups": groups.drop("name_key"),
                    "collectives": comm.select(*[c for c in SCHEMAS["collectives"] if c in comm.columns],
                                               "group_size"),
                    "steps": steps.join(file_rank, on="f").drop("f") if not steps.is_empty() else steps},
            spill=spill, comm_events=comm.select("rank", "event_id", "stream", "start_ns", "end_ns"),
            dropped=sum((p.dropped for p in parsed), Dropped()))
    data.sources = [str(f.resolve()) for f in files]
    data.world_size = world
    data.rank_source = ",".join(sorted(set(rank_sources)))
    data.device = ", ".join(sorted({d for p in parsed for d in p.device_names})) or None
    data.frames["ranks"] = ranks_frame
    return data


def _cpu_run(parsed: list[ParsedFile], file_rank: pl.DataFrame, offsets: list[int], groups: pl.DataFrame,
             options: IngestOptions) -> RunData:
    """A CPU-only (gloo) run, read whole: its compute and communication are found across ranks
    (:mod:`traceana.ingest.kineto.cpu`). Such runs are small (a profiled CPU job, not a GPU cluster's)."""
    from traceana.ingest.kineto.cpu import cpu_frames

    con = duckdb.connect()
    con.execute(EVENT_TABLE)
    for index, part in enumerate(parsed):
        con.register("parsed", from_ipc(part.whole or b""))
        con.execute(f"INSERT INTO ev SELECT {index} AS f, * EXCLUDE (f) FROM parsed")
        con.unregister("parsed")
    for index, offset in enumerate(offsets):
        if offset:
            con.execute("UPDATE ev SET start_ns = start_ns + $o, end_ns = end_ns + $o WHERE f = $f",
                        {"o": offset, "f": index})
    events, comm, steps = cpu_frames(con, file_rank, groups, options)
    # profile_memory=True samples of the CPU allocator (device type 0)
    memory = con.sql("SELECT f, start_ns AS ts_ns, mem_allocated AS allocated_bytes, mem_reserved AS reserved_bytes "
                     "FROM ev WHERE name = '[memory]' AND mem_device_type = 0 ORDER BY f, start_ns").pl()
    notes = ["no device activity: CPU-only run, compute from the main thread's CPU ops"]
    if not memory.is_empty():
        notes.append("CPU memory samples count only what was allocated while the profiler ran: tensors that "
                     "existed before it started (parameters, optimizer state) are not in them")
    return RunData(
        source_format="kineto", sources=[], world_size=0, notes=notes,
        tool_version="; ".join(dict.fromkeys(p.vintage for p in parsed)) + ", cpu-only",
        frames={
            "process_groups": groups.drop("name_key"),
            "device_events": events.join(file_rank, on="f"),
            "collectives": comm,
            "steps": steps.join(file_rank, on="f") if not steps.is_empty() else steps,
            "memory": memory.join(file_rank, on="f"),
            "annotations": con.sql(_HOST_RANGES_SQL).pl().join(file_rank, on="f"),
        },
    )


def _align_hosts(samples: list[pl.DataFrame], hosts: list[str | None]) -> list[int]:
    """Coarse clock alignment across hosts, before anything is matched by time; returns each file's offset.

    One collective ends at nearly the same instant on all its ranks, so between two hosts the differences of end
    times of same-named, same-size communication events pile up at the clock offset, while unrelated pairs spread
    out. Per host, the densest 100 us bin of those differences against the first host (one rank each, its first
    2,000 events: ``samples``, per file) gives the offset, the median inside it the value. finish() refines it by
    matched collectives and Send/Recv pairs. A host sharing no such event with the first keeps offset 0.
    """
    if len({h for h in hosts if h is not None}) < 2 or hosts[0] is None:
        return [0] * len(hosts)
    con = duckdb.connect()
    con.register("ref", samples[0].to_arrow())
    shifts = {}
    for host in dict.fromkeys(h for h in hosts if h not in (None, hosts[0])):  # one host at a time: memory
        con.register("comm", samples[hosts.index(host)].to_arrow())
        shifts[host] = con.execute("""
            WITH diff AS (SELECT r.end_ns - c.end_ns AS d FROM comm c JOIN ref r ON c.name = r.name AND c.n = r.n),
            best AS (SELECT arg_max(bin, n) AS bin FROM (SELECT round(d / 1e5) AS bin, count(*) AS n FROM diff
                                                          GROUP BY ALL))
            SELECT CAST(round(median(d)) AS BIGINT) FROM diff, best WHERE abs(d / 1e5 - bin) <= 1""").fetchall()[0][0]
    return [int(shifts.get(h) or 0) for h in hosts]


