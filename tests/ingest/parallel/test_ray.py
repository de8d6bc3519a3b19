"""`traceana ingest --executor ray` on a local Ray instance (`ray.init(num_cpus=2)`, one for the module): the same
per-file parse as Ray tasks gives every table the local path gives, written as a Parquet dataset; a task failing on a
file is that file's one line and leaves the dataset as it was. Skipped where Ray is not installed."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, TRACES, run_cli, run_main, store_rows

TOY8 = SAMPLES / "toy8_tp2pp2dp2_1f1b"  # 8 ranks, 8 files: 8 Kineto tasks on 2 CPUs
SAMPLED = [TRACES / "kineto" / f"hta_sampled_rank{r}of128.json.gz" for r in (0, 1)]  # two GPU ranks of one job
NSYS = TRACES / "nsys" / "nsysai_h100_2proc_nsys2026.2.sqlite"  # the nsys parse, as a task
RUNS = {"toy8": [TOY8, "--layout", "tp=2,pp=2,dp=2"], "sampled": SAMPLED, "nsys": [NSYS]}


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    yield ray
    ray.shutdown()


def files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def ingest(*args: object) -> tuple[int, str, str]:
    return run_main("ingest", *args)


@pytest.fixture(scope="module")
def stores(ray_cluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The runs ingested by Ray tasks into a dataset, and in this process into a .duckdb store."""
    folder = tmp_path_factory.mktemp("ray")
    local, dataset = folder / "local.duckdb", folder / "ray.parquet"
    for run_id, args in RUNS.items():
        assert ingest(*args, "--db", local, "--run-id", run_id, "--jobs", "1")[0] == 0
        code, out, err = ingest(*args, "--db", dataset, "--run-id", run_id, "--executor", "ray")
        assert code == 0, err
        assert f"-> {dataset}" in out and "error" not in err.lower()
    return local, dataset


def test_ray_tasks_give_every_table_the_local_path_gives(stores: tuple[Path, Path]) -> None:
    local, dataset = stores
    expected = store_rows(local)
    assert {t: len(rows) - 1 for t, rows in expected.items() if t in ("runs", "ranks")} == {"runs": 3, "ranks": 12}
    got = store_rows(dataset)
    assert [t for t in expected if got[t] != expected[t]] == []
    assert (dataset / "device_events" / "run_id=toy8" / "rank=7").is_dir()


@pytest.mark.parametrize("run", list(RUNS))
def test_breakdown_over_the_ray_dataset_equals_the_local_stores(stores: tuple[Path, Path], run: str) -> None:
    local, dataset = stores
    outputs = [run_main("breakdown", run, "--json", "--db", db) for db in (local, dataset)]
    assert outputs[0][0] == outputs[1][0] == 0
    assert outputs[0][1] == outputs[1][1] and '"rank"' in outputs[0][1]


def test_a_task_failing_on_a_file_is_its_one_line_and_writes_nothing(stores: tuple[Path, Path],
                                                                      tmp_path: Path) -> None:
    dataset = tmp_path / "ds"
    shutil.copytree(stores[1], dataset)
    inputs = tmp_path / "in"
    inputs.mkdir()
    for source in sorted(TOY8.iterdir()):
        shutil.copy(source, inputs)
    bad = inputs / "rank5.json.gz"
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])  # cut short: a copy that stopped
    before = files(tmp_path)
    code, _, err = ingest(inputs, "--db", dataset, "--run-id", "toy8", "--executor", "ray")
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and lines[0].startswith(f"error: {bad}:"), err
    assert files(tmp_path) == before


def test_executor_options_are_checked(tmp_path: Path) -> None:
    for args, message in ((["--executor", "dask"], "--executor 'dask': expected local or ray"),
                          (["--ray-address", "auto"], "--ray-address goes with --executor ray"),
                          (["--executor", "ray", "--jobs", "2"], "with --executor ray the Ray cluster sizes itself")):
        code, _, err = ingest(TOY8, "--db", tmp_path / "x.duckdb", *args)
        assert code != 0 and message in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


def test_without_ray_installed_it_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed
    code, _, err = ingest(TOY8, "--db", tmp_path / "x", "--executor", "ray")
    assert code != 0 and err.strip() == ("error: --executor ray needs Ray, which is not installed: "
                                         "pip install 'traceana[ray]'")
    assert list(tmp_path.iterdir()) == []


def test_a_cluster_that_does_not_answer_is_given_up_after_ray_timeout(tmp_path: Path) -> None:
    """Nothing listens at 127.0.0.1:1 and Ray keeps retrying; --ray-timeout bounds the wait (a process of its own:
    this module's Ray is already initialised in-process)."""
    pytest.importorskip("ray")
    result = run_cli("ingest", TOY8, "--db", tmp_path / "x.duckdb", "--executor", "ray", "--ray-address",
                     "127.0.0.1:1", "--ray-timeout", "2", check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == ("error: cannot reach Ray at 127.0.0.1:1 within 2 s "
                                                      "(--ray-timeout)")
    assert list(tmp_path.iterdir()) == []


def processes_with(variable: str) -> list[int]:
    """Other processes whose environment holds ``variable`` (NAME=value): what a command started, however its
    processes renamed themselves (Ray's workers and agents do)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # ended, or not ours to read
            continue
        if variable.encode() in environ and int(pid) != os.getpid():
            found.append(int(pid))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="looks for leftover processes in /proc")
def test_with_no_ray_running_the_command_starts_one_and_ends_it(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """As a user runs it: a fresh process, no ray.init before it, no RAY_ADDRESS, and a Ray temp folder of its own
    (RAY_TMPDIR, short: Ray's socket paths must fit 107 bytes) where no `ray start` left an address. The Ray it
    starts gives the local path's tables, and nothing of it outlives the command."""
    pytest.importorskip("ray")
    ray_tmp = tempfile.mkdtemp(prefix="ray-")
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    try:
        local, dataset = tmp_path / "local.duckdb", tmp_path / "ray.parquet"
        assert ingest(*RUNS["toy8"], "--db", local, "--jobs", "1")[0] == 0
        result = run_cli("ingest", *RUNS["toy8"], "--db", dataset, "--executor", "ray")
        assert f"-> {dataset}" in result.stdout and "error" not in result.stderr.lower()
        assert "\n  Ray: 8 tasks ran on 1 node(s) (8 tasks)\n" in result.stdout
        assert store_rows(dataset) == store_rows(local)
        assert processes_with(f"RAY_TMPDIR={ray_tmp}") == []
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
