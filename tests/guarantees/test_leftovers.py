"""Nothing left running, nothing left behind: an ingest killed with kill -9 takes its worker processes with it, the
next ingest into the store removes the folders killed writers left (and says so), a failed nsys export leaves no
empty cache folder, and a Parquet dataset has one writer at a time (a second gets one line, no run is lost)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, SAMPLES, TRACES, run_cli, run_main

GOOD = TRACES / "kineto" / "hta_rank0of2_pg_args.json.gz"


def sleepy(path: Path) -> Path:
    """A worker's parse that outlives its parent unless something ends it."""
    time.sleep(120)
    return path


def children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid`` (from /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_workers_end_when_a_killed_ingest_does() -> None:
    """map_files is what every local ingest parses through (--jobs N): kill -9 its process mid-parse."""
    script = ("import sys; from pathlib import Path; from tests.guarantees.test_leftovers import sleepy; "
              "from traceana.ingest.parallel.executor import map_files; "
              "print(list(map_files(sleepy, [Path('a'), Path('b')], 2)))")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(workers := children(parent.pid)) < 3 and time.monotonic() < deadline:  # 2 workers, the tracker
            time.sleep(0.2)
        assert len(workers) >= 2, workers
        time.sleep(1)  # the workers are in sleepy now
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while any(map(alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [w for w in workers if alive(w)], "worker processes outlived the killed ingest"
    finally:
        for pid in children(parent.pid) if parent.poll() is None else ():
            os.kill(pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()


def dead_pid() -> int:
    """The id of a process that has ended."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


@pytest.mark.parametrize("db", ["s.duckdb", "s.parquet"])
def test_the_next_ingest_removes_what_killed_writers_left_and_says_so(tmp_path, db) -> None:
    pid = dead_pid()
    left = [f"{db}.ingest-{pid}-k2j4x", f".{db}.buffer-{pid}-a8q", f".{db}.partial-{pid}", f".{db}.old-{pid}"]
    live = [f"{db}.ingest-{os.getppid()}-live", f"other.duckdb.ingest-{pid}-x"]  # a live writer's; another store's
    for name in left + live:
        (tmp_path / name / "device_events").mkdir(parents=True)
        (tmp_path / name / "device_events" / "part.parquet").write_bytes(b"PAR1")
    code, out, err = run_main("ingest", GOOD, "--db", tmp_path / db)
    assert code == 0, err
    assert out.splitlines()[0] == (f"note: removed 4 folder(s) that killed writers of {tmp_path / db} left behind: "
                                   f"{', '.join(sorted(left))}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([db, *live])
    code, out, _ = run_main("ingest", GOOD, "--db", tmp_path / db)
    assert code == 0 and not out.startswith("note: removed")


def test_a_failed_nsys_export_leaves_no_cache_folder(tmp_path, monkeypatch) -> None:
    """An .nsys-rep is exported with nsys into .traceana-cache beside the store; here an nsys that fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nsys").write_text("#!/bin/sh\necho 'nsys: cannot open the report' >&2\nexit 3\n")
    (bin_dir / "nsys").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    report = tmp_path / "in" / "job.nsys-rep"
    report.parent.mkdir()
    report.write_bytes(b"not really a report")
    store = tmp_path / "st" / "s.duckdb"
    store.parent.mkdir()
    code, _, err = run_main("ingest", report, "--db", store)
    assert code == 2 and "nsys export failed (nsys: cannot open the report)" in err
    assert list(store.parent.iterdir()) == []


def test_a_second_writer_of_a_dataset_gets_one_line(tmp_path) -> None:
    from traceana.store.dataset import writer_lock

    db = tmp_path / "runs.parquet"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from traceana.store.dataset import writer_lock\n"
                               f"with writer_lock(Path({str(db)!r})):\n print('ready', flush=True); time.sleep(60)"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        code, _, err = run_main("ingest", GOOD, "--db", db)
        assert (code, err.strip()) == (2, f"error: {db}: another traceana process is writing this dataset; "
                                          "retry when it ends")
        assert not db.exists()
    finally:
        holder.kill()
        holder.wait()
    with writer_lock(db):  # the killed holder's lock went with it
        pass
    assert run_main("ingest", GOOD, "--db", db)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.parquet"]


def test_concurrent_ingests_into_a_dataset_lose_no_run(tmp_path) -> None:
    """Ten at once: each either lands its run or says another process is writing; before, all exited 0 and the
    runs of those that merged into the same old version were gone."""
    db = tmp_path / "runs.parquet"
    procs = [subprocess.Popen([sys.executable, "-m", "traceana", "ingest", str(GOOD), "--db", str(db), "--run-id",
                               f"r{i}"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for i in range(10)]
    results = [(p.wait(timeout=300), p.stderr.read() if p.stderr else "") for p in procs]
    landed = {f"r{i}" for i, (code, _) in enumerate(results) if code == 0}
    refused = [err for code, err in results if code != 0]
    assert all(err.strip().endswith("another traceana process is writing this dataset; retry when it ends")
               for err in refused), refused
    assert landed
    code, out, err = run_main("sql", "--db", db, "SELECT run_id FROM runs")
    assert code == 0, err
    assert {r for r in landed if r in out} == landed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.parquet"]


def test_a_read_only_dataset_is_refused_before_parsing_and_leaves_nothing() -> None:
    """Another user's ingest into a dataset whose folders are read-only: one line before the trace is read, and
    no `.NAME.partial-<pid>` beside it (a copy of its folders kept their modes, which rmtree could not remove)."""
    import shutil
    import tempfile

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("running as another user needs root and setpriv")
    tmp_path = Path(tempfile.mkdtemp())  # pytest's folders are root's alone: the other user could not reach it
    tmp_path.chmod(0o1777)
    dataset = tmp_path / "ds.parquet"
    run_cli("ingest", SAMPLES / "moe_balanced", "--db", dataset)
    subprocess.run(["chmod", "-R", "a-w", str(dataset)], check=True)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                             "traceana", "ingest", str(SAMPLES / "moe_balanced"), "--run-id", "other", "--db",
                             str(dataset)], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "HOME": "/tmp"})
    assert result.returncode == 2 and result.stderr == f"error: {dataset}: the dataset is read-only for this user; " \
                                                      "it is unchanged\n", result.stderr
    try:
        assert sorted(p.name for p in tmp_path.iterdir()) == before
    finally:
        shutil.rmtree(tmp_path)

