"""Property-based fuzzing of `traceana ingest` over the real shared traces of every format.

Each case copies one real trace, damages it as real files get damaged or drift (truncated, tables or columns
dropped, values of the wrong type, the profilers' "none" sentinels, NULLs, reversed intervals, huge numbers,
non-UTF-8 bytes, wrong-typed metadata) and ingests it into a copy of a real store, in this process (no interpreter
start per case). Whatever happens, the promise holds: exit 0 or 2, never a traceback or an internal error; on
failure exactly one line on stderr and the store folder byte-for-byte as it was; on success the reports run, and
each count lower than the undamaged input's (device events, collectives, rank-steps, ranks) is named by a new note:
a drop without one is a silent wrong result.

Runs of several files (one damaged, an extra file that must be refused, --jobs 2, a dataset, a killed ingest's
leftovers) are held to more: an exit 0 stores every rank and each undamaged file's events exactly, and leaves
nothing beside the store.

CI runs a few examples per property, derandomized (about a minute in all). A longer local run, random each time:
    TRACEANA_FUZZ_EXAMPLES=210 TRACEANA_FUZZ_LOG=/tmp/fuzz.jsonl .venv/bin/pytest -q tests/test_fuzz.py
(210 examples x 5 properties = 1,050 cases; the log has one JSON line per case: format, damage, exit code, message,
and for runs whether the result was silently wrong and what was left beside the store.)
"""

from __future__ import annotations

import atexit
import gzip
import hashlib
import json
import os
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Collection
from contextlib import suppress
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, TRACES, run_main

EXAMPLES = int(os.environ.get("TRACEANA_FUZZ_EXAMPLES", "10"))
LOG = os.environ.get("TRACEANA_FUZZ_LOG")
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize="TRACEANA_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=list(HealthCheck))

# Values real exports hold where they should not: sentinels, out-of-range and wrong-typed values, NULL.
ODD = [None, -1, 0, 4294967295, 2**31, 2**40, 2**63 - 1, 2**63, 2**64 - 1, -(10**15), 1e30, 1.5, "abc", "", "-1",
       "四", [], {}, [1, "x"], True]
odd = st.sampled_from(ODD)

KINETO = [TRACES / "kineto" / "hta_sampled_rank0of128.json.gz", TRACES / "kineto" / "hta_rank0of2_pg_args.json.gz"]
NSYS = [TRACES / "nsys" / "pipit_saxpy_mpi_1rank_nsys2022.2.sqlite", TRACES / "nsys" / "nsysai_mock_odd_schema.sqlite",
        TRACES / "nsys" / "nsysai_h100_2proc_nsys2026.2.sqlite"]
ASCEND_DB = TRACES / "ascend" / "torch_npu_2rank_level1_db"
ASCEND_TEXT = TRACES / "ascend" / "torch_npu_2rank_level0" / "rank0_ascend_pt"
NSYS_TABLES = ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
               "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "StringIds", "ThreadNames", "EXPORT_META_DATA",
               "META_DATA_EXPORT", "TARGET_INFO_SESSION_START_TIME", "TARGET_INFO_SYSTEM_ENV", "META_DATA_CAPTURE"]
ASCEND_TABLES = ["TASK", "COMPUTE_TASK_INFO", "COMMUNICATION_OP", "COMMUNICATION_TASK_INFO", "STRING_IDS", "STEP_TIME",
                 "RANK_DEVICE_MAP", "META_DATA", "MEMORY_RECORD", "HOST_INFO", "PYTORCH_API", "ENUM_HCCL_DATA_TYPE"]
KINETO_FIELDS = ["ts", "dur", "pid", "tid", "name", "ph", "cat", "args", "args.External id", "args.correlation",
                 "args.stream", "args.Collective name", "args.In msg nelems", "args.Process Group Ranks",
                 "args.Process Group Name", "args.dtype", "args.Seq", "args.Total Allocated", "args.Device Type"]
KINETO_META = ["distributedInfo", "distributedInfo.rank", "distributedInfo.world_size", "distributedInfo.pg_config",
               "distributedInfo.pg_config.0.ranks", "distributedInfo.pg_config.0", "baseTimeNanoseconds",
               "traceEvents"]
TIMELINE_FIELDS = ["ts", "dur", "pid", "tid", "name", "ph", "cat", "args", "args.name", "args.labels", "args.count",
                   "args.data_type", "args.src rank", "args.size(Byte)"]

# ---------------------------------------------------------------------------------------------------------------
# Damage


def _set(obj: object, path: str, value: object) -> None:
    """Set obj[a][b]... (list indices as digits); missing parents are skipped: the field is simply absent."""
    *parents, last = path.split(".")
    for key in parents:
        if isinstance(obj, list) and key.isdigit() and int(key) < len(obj):
            obj = obj[int(key)]
        elif isinstance(obj, dict) and isinstance(obj.get(key), dict | list):
            obj = obj[key]
        else:
            return
    if isinstance(obj, dict):
        obj[last] = value
    elif isinstance(obj, list) and last.isdigit() and int(last) < len(obj):
        obj[int(last)] = value


def _events_damage(events: list, every: int, offset: int, field: str, value: object) -> None:
    for event in events[offset % max(len(events), 1)::every]:
        if isinstance(event, dict):
            _set(event, field, value)


def _bytes_damage(data: bytes, kind: str, at: float) -> bytes:
    cut = int(len(data) * at)
    return data[:cut] if kind == "truncate" else data[:cut] + b"\xff\xfe\xc3(" + data[cut:]


bytes_damage = st.tuples(st.sampled_from(["truncate", "non-utf8"]), st.floats(0.0, 0.999))


def _sqlite_value(value: object) -> object:
    """What a writer would have stored: big ints as SQLite stores them (REAL past int64), lists as text."""
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        return float(value)
    if isinstance(value, list | dict):
        return json.dumps(value)
    return value


def _sqlite_damage(path: Path, damage: tuple) -> None:
    """One change to an SQLite export: update a column (every n-th row), drop a table or a column, empty a table."""
    kind, table, pick, value, every = damage
    with suppress(sqlite3.Error), sqlite3.connect(path) as con:  # a change the damaged file cannot take is skipped
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if table not in tables:
            return
        columns = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
        column = columns[pick % len(columns)]
        if kind == "drop_table":
            con.execute(f'DROP TABLE "{table}"')
        elif kind == "empty":
            con.execute(f'DELETE FROM "{table}"')
        elif kind == "drop_column":  # by rebuilding: SQLite refuses to drop indexed columns
            keep = ", ".join(f'"{c}"' for c in columns if c != column) or "1 AS x"
            con.execute(f'CREATE TABLE _t AS SELECT {keep} FROM "{table}"')
            con.execute(f'DROP TABLE "{table}"')
            con.execute(f'ALTER TABLE _t RENAME TO "{table}"')
        else:  # rebuilt without NOT NULL constraints first, as a sloppy writer would have made it
            con.execute(f'CREATE TABLE _t AS SELECT * FROM "{table}"')
            con.execute(f'DROP TABLE "{table}"')
            con.execute(f'ALTER TABLE _t RENAME TO "{table}"')
            con.execute(f'UPDATE "{table}" SET "{column}" = ? WHERE rowid % ? = 0', [_sqlite_value(value), every])


def _unless_emptied(changes: list[tuple], reference: tuple) -> tuple | None:
    """An emptied table is an export that recorded no such rows (no drop to account for): nothing to compare."""
    return None if any(kind == "empty" for kind, *_ in changes) else reference


def sqlite_damage(tables: list[str]) -> st.SearchStrategy:
    return st.tuples(st.sampled_from(["update", "update", "update", "drop_table", "drop_column", "empty"]),
                     st.sampled_from(tables), st.integers(0, 40), st.one_of(odd, st.just(b"\xff\xfe")),
                     st.sampled_from([1, 2, 7, 50]))


# ---------------------------------------------------------------------------------------------------------------
# The promise


def _session_dir(prefix: str) -> Path:
    """A temporary folder for what the cached helpers below make once per session (hypothesis runs a test's cases
    without fixtures between them), removed when the session's process ends."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, folder, True)
    return folder


@cache
def _good_store() -> Path:
    """A real store (one Kineto run) that every case ingests into a copy of."""
    path = _session_dir("traceana-fuzz-") / "good.duckdb"
    assert run_main("ingest", KINETO[0], "--db", path)[0] == 0
    return path


@cache
def _good_runs() -> frozenset[str]:
    return frozenset(_counts_runs(_good_store()))


def _counts_runs(db: Path) -> list[str]:
    from traceana import store

    with store.connect(db, read_only=True, views=False) as con:
        return [r for (r,) in con.execute("SELECT run_id FROM runs").fetchall()]


def _fingerprint(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


# What an exit 0 is held to against the undamaged input: a count lower than the undamaged one is a drop, and each
# drop must be named by a note the undamaged run does not have (new, or its count changed) that says what was left
# out. Device events left out account for collectives (each is a device event) and for steps (windows of them).
_LEFT_OUT = r"[^:;]*\b(left out|ignored)\b"
_EVENTS = r"\b(device events?|events|spans|kernels?|tasks?|TASK|GPU activity|HCCL|ops|CUPTI_\w+)\b" + _LEFT_OUT
_ABSENT = r"\bno [\w ]+ table\b|\bhas no column\b"
NAMING = {"device_events": [_EVENTS, _ABSENT],
          "collectives": [r"\bcollectives?\b" + _LEFT_OUT, _EVENTS, _ABSENT],
          "steps": [r"\b(steps?|ProfilerStep|step markers?|annotations?)\b" + _LEFT_OUT, _EVENTS, _ABSENT],
          "ranks": [r"\b(ranks?|process(es)?)\b" + _LEFT_OUT, _ABSENT]}
COUNTED = list(NAMING)


def _counts(db: Path, exclude: Collection[str] = ()) -> tuple[dict[str, int], list[str]]:
    """The store's device events, collectives, rank-steps and ranks over its runs not in ``exclude``, and their
    notes."""
    from traceana import store

    with store.connect(db, read_only=True, views=False) as con:
        runs = [r for (r,) in con.execute("SELECT run_id FROM runs").fetchall() if r not in exclude]
        counts = {table: con.execute(f"SELECT count(*) FROM {table} WHERE list_contains(?, run_id)",
                                     [runs]).fetchone()[0] for table in COUNTED}
        notes = [n for (ns,) in con.execute("SELECT notes FROM runs WHERE list_contains(?, run_id)", [runs]).fetchall()
                 for n in ns or []]
    return counts, notes


def silent_drops(counts: dict[str, int], notes: list[str], reference: tuple[dict[str, int], list[str]]) -> list[str]:
    """The quantities lower than in the undamaged run that no new note names: each one a silent drop."""
    fresh = [n for n in notes if n not in reference[1]]
    return [f"{table} {counts[table]} < {reference[0][table]}" for table, patterns in NAMING.items()
            if counts[table] < reference[0][table]
            and not any(re.search(p, n, re.IGNORECASE) for p in patterns for n in fresh)]


_UNDAMAGED: dict[object, tuple[dict[str, int], list[str]]] = {}


def undamaged(key: object, inputs: Path) -> tuple[dict[str, int], list[str]]:
    """The counts and notes of ``inputs`` before any damage (called before it is damaged; ``key`` names the base:
    each is ingested once a session), ingested alone."""
    if key not in _UNDAMAGED:
        with tempfile.TemporaryDirectory() as tmp:
            assert run_main("ingest", inputs, "--db", Path(tmp) / "ref.duckdb")[0] == 0
            _UNDAMAGED[key] = _counts(Path(tmp) / "ref.duckdb")
    return _UNDAMAGED[key]


def check(inputs: Path, fmt: str, damage: object, reference: tuple[dict[str, int], list[str]] | None = None) -> None:
    """Ingest ``inputs`` into a copy of the good store and hold the promise; with the ``reference`` counts of the
    undamaged input, an exit 0 must also name every drop in a note."""
    folder = Path(tempfile.mkdtemp(prefix="traceana-store-"))
    try:
        store = folder / "s.duckdb"
        shutil.copy(_good_store(), store)
        before = _fingerprint(folder)
        code, _, err = run_main("ingest", inputs, "--db", store)
        lines = err.strip().splitlines()
        changed = code != 0 and _fingerprint(folder) != before
        report_code, report_err = (run_main("breakdown", "--db", store)[::2]) if code == 0 else (0, "")
        counts, notes = _counts(store, _good_runs()) if code == 0 else ({}, [])
        silent = silent_drops(counts, notes, reference) if code == 0 and reference else []
        if LOG:
            with open(LOG, "a") as log:
                log.write(json.dumps({"format": fmt, "damage": repr(damage)[:300], "code": code,
                                      "message": lines[0][:300] if lines else "", "store_changed": changed,
                                      "traceback": "Traceback" in err + report_err,
                                      "report_code": report_code, "counts": counts,
                                      "reference": reference[0] if reference else None, "silent": silent,
                                      "notes": [n for n in notes if not reference or n not in reference[1]]}) + "\n")
        assert "Traceback" not in err and code in (0, 2), (damage, err[-2000:])
        if code:
            assert len(lines) == 1 and lines[0].startswith("error: ") and "internal error" not in lines[0], \
                (damage, err)
            assert not changed, (damage, "the store changed on a failed ingest")
        assert "Traceback" not in report_err and report_code in (0, 2), (damage, report_err[-2000:])
        assert report_code == 0 or len(report_err.strip().splitlines()) == 1, (damage, report_err)
        assert not silent, (damage, "left out without a note:", silent, notes)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------
# One property per format


@cache
def _kineto(base: Path) -> str:
    return gzip.decompress(base.read_bytes()).decode()


@FUZZ
@given(base=st.sampled_from(KINETO),
       events=st.lists(st.tuples(st.integers(1, 60), st.integers(0, 1000), st.sampled_from(KINETO_FIELDS), odd),
                       max_size=3),
       meta=st.lists(st.tuples(st.sampled_from(KINETO_META), odd), max_size=2),
       reverse=st.sampled_from([0, 0, 1, 3, 40]), raw=st.one_of(st.none(), bytes_damage), gz=st.booleans())
def test_kineto_damage_is_ingested_or_one_line(base, events, meta, reverse, raw, gz) -> None:
    trace = json.loads(_kineto(base))
    for every, offset, field, value in events:
        _events_damage(trace["traceEvents"], every, offset, field, value)
    if reverse:
        for event in trace["traceEvents"][::reverse]:
            if isinstance(event, dict) and isinstance(event.get("dur"), int | float):
                event["dur"] = -event["dur"] - 1
    for field, value in meta:
        _set(trace, field, value)
    data = json.dumps(trace).encode()
    if raw:
        data = _bytes_damage(data, *raw)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("rank0.json.gz" if gz else "rank0.json")
        path.write_text(_kineto(base))
        reference = undamaged(("kineto", base), path)
        path.write_bytes(gzip.compress(data, 1) if gz else data)
        emptied = any(field == "traceEvents" for field, _ in meta)  # another list of events: nothing to compare
        check(path, "kineto", (base.name, events, meta, reverse, raw), None if emptied else reference)


@FUZZ
@given(base=st.sampled_from(NSYS), changes=st.lists(sqlite_damage(NSYS_TABLES), min_size=1, max_size=3),
       raw=st.one_of(st.none(), st.none(), st.tuples(st.just("truncate"), st.floats(0.0, 0.999))))
def test_nsys_damage_is_ingested_or_one_line(base, changes, raw) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / base.name
        shutil.copy(base, path)
        os.chmod(path, 0o644)
        reference = undamaged(("nsys", base), path)
        for change in changes:
            _sqlite_damage(path, change)
        if raw:
            path.write_bytes(_bytes_damage(path.read_bytes(), *raw))
        check(path, "nsys", (base.name, changes, raw), _unless_emptied(changes, reference))


@FUZZ
@given(rank=st.sampled_from([0, 1]), changes=st.lists(sqlite_damage(ASCEND_TABLES), min_size=1, max_size=3),
       metadata=st.one_of(st.none(), st.tuples(st.sampled_from(["parallel_group_info", "distributed_args"]), odd)),
       rank_id=st.one_of(st.none(), odd), raw=st.one_of(st.none(), st.none(), st.tuples(st.just("truncate"),
                                                                                          st.floats(0.0, 0.999))))
def test_ascend_database_damage_is_ingested_or_one_line(rank, changes, metadata, rank_id, raw) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "run"
        shutil.copytree(ASCEND_DB, folder)
        for path in folder.rglob("*"):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        db = folder / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / f"ascend_pytorch_profiler_{rank}.db"
        reference = undamaged("ascend-db", folder)
        for change in changes:
            _sqlite_damage(db, change)
        if metadata:
            with suppress(sqlite3.Error), sqlite3.connect(db) as con:  # META_DATA may be gone already
                con.execute("INSERT INTO META_DATA (name, value) VALUES (?, ?)",
                            [metadata[0], json.dumps(metadata[1])])
        if rank_id is not None:
            info = folder / f"rank{rank}_ascend_pt" / f"profiler_info_{rank}.json"
            info.write_text(json.dumps({**json.loads(info.read_text()), "rank_id": rank_id}))
        if raw:
            db.write_bytes(_bytes_damage(db.read_bytes(), *raw))
        check(folder, "ascend-db", (rank, changes, metadata, rank_id, raw), _unless_emptied(changes, reference))


@cache
def _timeline() -> str:
    return (ASCEND_TEXT / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").read_text()


@FUZZ
@given(events=st.lists(st.tuples(st.integers(1, 60), st.integers(0, 1000), st.sampled_from(TIMELINE_FIELDS), odd),
                       max_size=3),
       memory=st.one_of(st.none(), bytes_damage, st.sampled_from(["no-header", "bad-rows", "missing-column"])),
       metadata=st.one_of(st.none(), st.tuples(st.sampled_from(["parallel_group_info", "distributed_args"]), odd)),
       raw=st.one_of(st.none(), st.none(), bytes_damage))
# the fuzz's shrunk case of an IndexError (DuckDB raised with an empty message)
@example(events=[], memory=None, metadata=None, raw=("non-utf8", 0.0))
def test_ascend_text_damage_is_ingested_or_one_line(events, memory, metadata, raw) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "rank0_ascend_pt"
        shutil.copytree(ASCEND_TEXT, folder)
        output = folder / "ASCEND_PROFILER_OUTPUT"
        for path in folder.rglob("*"):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        reference = undamaged("ascend-text", folder)
        timeline = json.loads(_timeline())
        for every, offset, field, value in events:
            _events_damage(timeline, every, offset, field, value)
        data = json.dumps(timeline).encode()
        (output / "trace_view.json").write_bytes(_bytes_damage(data, *raw) if raw else data)
        csv = output / "memory_record.csv"
        lines = csv.read_bytes().splitlines(keepends=True)
        if memory == "no-header":
            csv.write_bytes(b"".join(lines[1:]))
        elif memory == "bad-rows":
            csv.write_bytes(b"".join([*lines[:5], b"PTA,not a time,x,y\n", b"PTA\n", *lines[5:]]))
        elif memory == "missing-column":
            csv.write_bytes(b"".join(line.replace(b"Total Reserved(MB),", b"") for line in lines[:1]) +
                            b"".join(lines[1:]))
        elif memory:
            csv.write_bytes(_bytes_damage(csv.read_bytes(), *memory))
        if metadata:
            meta = folder / "profiler_metadata.json"
            meta.write_text(json.dumps({**json.loads(meta.read_text()), metadata[0]: metadata[1]}))
        check(folder, "ascend-text", (events, memory, metadata, raw), reference)


# ---------------------------------------------------------------------------------------------------------------
# Runs of several files: one damaged, one extra that must be refused, --jobs 2, a Parquet dataset, leftovers


@cache
def _synth_run(fmt: str) -> Path:
    """Four per-rank files of one synthetic job (traceana synth), made once per session."""
    out = _session_dir("traceana-fuzz-run-") / "out"
    assert run_main("synth", ROOT / "examples" / "synth_gpt_tp2pp2.yaml", out, "--ranks", 4, "--steps", 2,
                    "--format", fmt)[0] == 0
    return out / "traces"


def _events_per_source(db: Path) -> dict[str, int]:
    """Stored device events per input file name (ranks.source)."""
    from traceana import store

    with store.connect(db, read_only=True, views=False) as con:
        rows = con.execute("SELECT r.source, count(e.rank) FROM ranks r LEFT JOIN device_events e "
                           "ON e.run_id = r.run_id AND e.rank = r.rank GROUP BY ALL").fetchall()
    return {Path(source).name: count for source, count in rows}


@cache
def _reference(fmt: str) -> dict[str, int]:
    """What the undamaged run holds, per file: the second route the stored counts are held to."""
    db = _session_dir("traceana-fuzz-ref-") / "ref.duckdb"
    assert run_main("ingest", _synth_run(fmt), "--db", db)[0] == 0
    return _events_per_source(db)


@cache
def _reference_run() -> str:
    """The run id KINETO[1] gets: the run the stores of several-file runs already hold."""
    with tempfile.TemporaryDirectory() as tmp:
        assert run_main("ingest", KINETO[1], "--db", Path(tmp) / "s.duckdb")[0] == 0
        return _counts_runs(Path(tmp) / "s.duckdb")[0]


def _folder_fingerprint(folder: Path) -> dict[str, str]:
    """Every file and folder under ``folder`` (leftover folders, lock files and Parquet parts included)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


# Extras that must make the ingest fail naming a file: exit 0 with them is a silent wrong result.
REFUSED = ("garbage-export", "copy", "foreign-format")


def _add_extra(folder: Path, fmt: str, extra: str) -> None:
    files = sorted(folder.iterdir())
    if extra == "garbage-export":
        (folder / ("rank_9.sqlite" if fmt == "nsys" else "rank9.json")).write_bytes(b"\x00garbage" * 50)
    elif extra == "copy":
        shutil.copy(files[0], folder / f"copy_of_{files[0].name}")
    elif extra == "foreign-format":
        other = _synth_run("kineto" if fmt == "nsys" else "nsys")
        shutil.copy(sorted(other.iterdir())[0], folder)


@pytest.mark.long
@FUZZ
@given(fmt=st.sampled_from(["kineto", "nsys"]), damaged=st.integers(0, 3),
       change=st.one_of(st.none(), st.tuples(st.integers(1, 60), st.integers(0, 1000), st.sampled_from(KINETO_FIELDS),
                                             odd), sqlite_damage(NSYS_TABLES)),
       extra=st.sampled_from([None, None, *REFUSED]), jobs=st.sampled_from([None, 2]),
       dataset=st.booleans(), leftover=st.booleans())
def test_runs_of_several_files_store_what_they_hold_or_fail_in_one_line(fmt, damaged, change, extra, jobs, dataset,
                                                                         leftover) -> None:
    """A folder of four ranks, one damaged and perhaps an extra file; exit 0 must store every rank, each undamaged
    file's events exactly, and leave nothing beside the store; exit 2 one line and the store folder as it was."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "run"
        shutil.copytree(_synth_run(fmt), folder)
        victim = sorted(folder.iterdir())[damaged]
        if fmt == "kineto" and isinstance(change, tuple) and len(change) == 4:
            trace = json.loads(victim.read_text())
            _events_damage(trace["traceEvents"], *change)
            victim.write_text(json.dumps(trace))
        elif fmt == "nsys" and isinstance(change, tuple) and len(change) == 5:
            _sqlite_damage(victim, change)
        else:
            change = None
        if extra:
            _add_extra(folder, fmt, extra)
        stores = Path(tmp) / "stores"
        stores.mkdir()
        db = stores / ("s.parquet" if dataset else "s.duckdb")
        assert run_main("ingest", KINETO[1], "--db", db)[0] == 0  # a store that already holds a run
        planted = f"{db.name}.ingest-{_dead_pid()}-x" if leftover else None
        if planted:
            (stores / planted).mkdir()
        before = {k: v for k, v in _folder_fingerprint(stores).items() if not planted or not k.startswith(planted)}
        code, out, err = run_main("ingest", folder, "--db", db, *(["--jobs", jobs] if jobs else []))
        lines = err.strip().splitlines()
        after = _folder_fingerprint(stores)
        silent, lost = False, []
        if code == 0:
            stored, reference = _events_per_source(db), _reference(fmt)
            lost = [name for name in reference if name != victim.name and stored.get(name) != reference[name]]
            silent = extra in REFUSED or bool(lost) or len(stored) != len(reference) + 1  # + the earlier run's
            if (stored.get(victim.name, 0) < reference[victim.name] and not (change and change[0] == "empty")
                    and not any(re.search(p, n, re.IGNORECASE) for p in NAMING["device_events"]
                                for n in _counts(db, [_reference_run()])[1])):
                lost.append(f"{victim.name}: {stored.get(victim.name, 0)} < {reference[victim.name]} without a note")
                silent = True
        left = sorted(k for k in after if "/" not in k and k not in (db.name, f"{db.name}.wal")) if code == 0 else []
        if LOG:
            with open(LOG, "a") as log:
                log.write(json.dumps({"format": f"run-{fmt}", "damage": repr((damaged, change, extra))[:300],
                                      "jobs": jobs, "dataset": dataset, "code": code,
                                      "message": lines[0][:300] if lines else "", "silent": silent,
                                      "leftovers": left, "store_changed": code != 0 and after != before,
                                      "traceback": "Traceback" in err}) + "\n")
        assert "Traceback" not in err and code in (0, 2), (change, extra, err[-2000:])
        if code:
            assert len(lines) == 1 and lines[0].startswith("error: ") and "internal error" not in lines[0], err
            assert after == before, "the store folder changed on a failed ingest"
        else:
            assert not silent, (change, extra, lost, out)
            assert left == [], left
            assert not planted or f"note: removed 1 folder(s) that killed writers of {db} left behind" in out


def _dead_pid() -> int:
    import subprocess
    import sys

    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


@pytest.mark.parametrize("fmt", ["kineto", "nsys", "ascend-db", "ascend-text"])
def test_the_undamaged_bases_ingest(fmt: str) -> None:
    """The fuzz bases themselves ingest: a failure above is the damage's doing, not the base's."""
    base = {"kineto": KINETO[1], "nsys": NSYS[0], "ascend-db": ASCEND_DB, "ascend-text": ASCEND_TEXT}[fmt]
    with tempfile.TemporaryDirectory() as tmp:
        assert run_main("ingest", base, "--db", Path(tmp) / "s.duckdb")[0] == 0
