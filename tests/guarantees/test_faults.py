"""User errors and faults that were internal errors (exit 1) or ran into memory: each is one line naming the file,
option or folder, exit 2, before the work it would spoil."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, TRACES, one_line, run_main, tmpfs

GOOD = TRACES / "kineto" / "hta_rank0of2_pg_args.json.gz"
SAXPY = TRACES / "nsys" / "pipit_saxpy_mpi_1rank_nsys2022.2.sqlite"
CONFIG = ROOT / "examples" / "synth_gpt_tp2pp2.yaml"



@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("good") / "s.duckdb"
    assert run_main("ingest", GOOD, "--db", path, "--run-id", "good")[0] == 0
    return path


def _nsys_copy(tmp_path: Path, sql: str, *params: object) -> Path:
    copy = tmp_path / SAXPY.name
    shutil.copy(SAXPY, copy)
    copy.chmod(0o644)
    with sqlite3.connect(copy) as con:
        con.execute(sql, params)
    return copy


def test_nsys_session_start_as_text_is_one_line(tmp_path) -> None:
    path = _nsys_copy(tmp_path, "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = 'yesterday'")
    assert one_line(*run_main("ingest", path, "--db", tmp_path / "s.duckdb")[::2]) == (
        f"error: {path}: TARGET_INFO_SESSION_START_TIME.utcEpochNs is 'yesterday', not a time in ns since 1970")


def test_nsys_mpi_rank_thread_past_int64_is_one_line(tmp_path) -> None:
    path = _nsys_copy(tmp_path, "UPDATE StringIds SET value = ? WHERE value = 'MPI Rank 0'", "MPI Rank " + "9" * 30)
    assert one_line(*run_main("ingest", path, "--db", tmp_path / "s.duckdb")[::2]) == (
        f"error: {path}: thread name 'MPI Rank N' is {'9' * 30}, not a rank (an integer 0 .. 2147483647)")


@pytest.mark.parametrize("command", [
    ["estimate", "{cfg}"], ["calibrate", "good", "--config", "{cfg}", "--db", "{db}"],
    ["report", "--db", "{db}", "--html", "{tmp}/r.html", "--estimate", "{cfg}"], ["synth", "{cfg}", "{tmp}/out"]])
def test_a_config_that_is_not_utf8_is_one_line(tmp_path, store, command) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_bytes(CONFIG.read_bytes().replace(b"model:", b"model: # \xff\xfe", 1))
    args = [a.format(cfg=cfg, db=store, tmp=tmp_path) for a in command]
    line = one_line(*run_main(*args)[::2])
    assert line.startswith(f"error: {cfg}: not a UTF-8 text file (byte ")


@pytest.mark.parametrize("command", [["diff", "good", "good"], ["comm"], ["kernels"]])
def test_a_top_no_table_has_is_one_line(store, command) -> None:
    assert one_line(*run_main(*command, "--db", store, "--top", 10**20)[::2]) == (
        "error: --top 100000000000000000000: more rows than any table lists; at most 1,000,000")


def test_export_where_nothing_can_be_written_is_one_line(store, tmp_path) -> None:
    (tmp_path / "a-file").write_text("x")
    for target, says in ((tmp_path / "missing" / "x.json", "is not a folder that exists"),
                         (tmp_path / "a-file" / "x.json", "is not a folder that exists"),
                         (Path("/proc/x.json"), "cannot write here")):
        assert says in one_line(*run_main("export", "--db", store, "--perfetto", target)[::2])
    assert "cannot write the dataset here" in one_line(*run_main("export", "--db", store, "--parquet",
                                                                  tmp_path / "a-file" / "ds")[::2])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


@pytest.mark.parametrize(("option", "says"), [
    (["--ranks", 4_000_000], "about 2,1"), (["--steps", 10**9], "about 1,4"), (["--kernel-us", 1e-9], "about 3"),
])
def test_synth_refuses_what_would_not_fit_at_once(tmp_path, option, says) -> None:
    """Refused up front with the estimate in the message (the first ran 59 s to a MemoryError); how long the refusal
    takes is benchmarks' business, not a test's."""
    line = one_line(*run_main("synth", CONFIG, tmp_path / "out", *option)[::2])
    assert line.startswith(f"error: {tmp_path / 'out'}: {says}") and "device ops" in line and "GB" in line
    assert not (tmp_path / "out").exists()


def test_synth_skew_that_overflows_is_one_line(tmp_path) -> None:
    assert one_line(*run_main("synth", CONFIG, tmp_path / "out", "--device-skew-us", -1e20)[::2]) == (
        "error: --host-skew-us and --device-skew-us: at most ±1e+09 µs (1000 s)")


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A read-only tmpfs: the kernel refuses every write (EROFS), even root's."""
    with tmpfs(tmp_path / "ro", "size=1m,ro") as mount:
        yield mount


@pytest.mark.parametrize("db", ["s.duckdb", "s.parquet", "sub/s.duckdb"])
def test_a_store_in_a_folder_that_cannot_be_written_is_said_before_reading(read_only, db) -> None:
    path = read_only / db
    assert one_line(*run_main("ingest", GOOD, "--db", path)[::2]) == (
        f"error: {path}: cannot write in {path.parent} (Read-only file system), where the store and its ingest's "
        "spill folder go; the store is unchanged")


def test_a_kineto_world_size_past_the_store_integer_is_one_line(tmp_path) -> None:
    """Found by the fuzz suite's long run: 2^31 passed the check and failed the store's INTEGER cast (exit 1)."""
    import gzip
    import json

    trace = json.loads(gzip.decompress(GOOD.read_bytes()))
    trace["distributedInfo"]["world_size"] = 2**31
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(trace))
    assert one_line(*run_main("ingest", path, "--db", tmp_path / "s.duckdb")[::2]) == (
        f"error: {path}: distributedInfo.world_size is 2147483648, not a number of ranks")


@pytest.mark.parametrize("exc", ["MemoryError", "OutOfMemoryException"])
def test_running_out_of_memory_is_one_line_that_says_so(store: Path, monkeypatch: pytest.MonkeyPatch,
                                                        exc: str) -> None:
    # a 1,024-rank dataset's replay once sorted its events past DuckDB's 1 GiB: "internal error", as if a bug
    import duckdb

    from traceana.model import replay

    error = MemoryError() if exc == "MemoryError" else duckdb.OutOfMemoryException(
        "Out of Memory Error: could not allocate block of size 256.0 KiB (1.0 GiB/1.0 GiB used)")

    def replay_run(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(replay, "replay_run", replay_run)
    line = one_line(*run_main("replay", "--db", store)[::2], expected=1)
    assert line.startswith(f"error: out of memory: the run is larger than this command can hold on this machine "
                           f"({exc}") and "internal error" not in line
