"""`traceana ingest --executor ray --ray-address` on a Ray cluster of three nodes on this machine, as on several
machines sharing storage: ray.cluster_utils.Cluster starts a head and two workers, each its own raylet with one CPU.
16 ranks of a real trace (hta_rank3of8_6steps, its rank rewritten) go into a Parquet dataset: every table equals
the local path's, and the command's last line says the tasks ran on every node. Then a worker node is removed while the
tasks of the same ingest run: Ray runs its tasks again on the nodes left, and the dataset still equals the local
path's. Long (80 s on this 2-core machine: three ingests of 560 MB of JSON); skipped where Ray is not installed."""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import ROOT, TRACES, run_main, store_rows

if TYPE_CHECKING:
    from ray.cluster_utils import Cluster

pytestmark = pytest.mark.long

SOURCE = TRACES / "kineto" / "hta_rank3of8_6steps.json.gz"
RANKS = 16


@pytest.fixture(scope="module")
def run16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RANKS copies of SOURCE, each with its own rank in a world of RANKS (the rest byte for byte the same)."""
    folder = tmp_path_factory.mktemp("run16")
    raw = gzip.decompress(SOURCE.read_bytes())
    info = b'"distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8}'
    assert raw.count(info) == 1
    for rank in range(RANKS):
        ours = info.replace(b'"rank": 3, "world_size": 8', f'"rank": {rank}, "world_size": {RANKS}'.encode())
        (folder / f"rank{rank}.json.gz").write_bytes(gzip.compress(raw.replace(info, ours), compresslevel=1))
    return folder


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """A head and two worker nodes, one CPU each, in a Ray temp folder of their own (RAY_TMPDIR, short: Ray's
    socket paths must fit 107 bytes; the Cluster writes its address there, not where other tests' Ray looks)."""
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    ray_tmp = tempfile.mkdtemp(prefix="ray-")
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def ingest_on(cluster: Cluster, folder: Path, dataset: Path) -> subprocess.Popen[str]:
    """The ingest as a user runs it on a cluster: its own process, pointed at the head."""
    return subprocess.Popen([sys.executable, "-m", "traceana", "ingest", str(folder), "--db", str(dataset),
                             "--executor", "ray", "--ray-address", cluster.address], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def nodes_used(out: str) -> int:
    """The node count of the command's line `Ray: N tasks ran on K node(s)`."""
    found = re.search(rf"^  Ray: {RANKS} tasks ran on (\d+) node\(s\)", out, re.MULTILINE)
    assert found, out
    return int(found[1])


def test_three_nodes_give_the_local_tables_and_a_lost_worker_is_run_again_elsewhere(
        cluster: Cluster, run16: Path, tmp_path: Path) -> None:
    local, dataset = tmp_path / "local.duckdb", tmp_path / "run.parquet"
    assert run_main("ingest", run16, "--db", local, "--jobs", "2")[0] == 0
    expected = store_rows(local)

    out, err = ingest_on(cluster, run16, dataset).communicate(timeout=600)
    assert f"-> {dataset}" in out and "error" not in err.lower(), err
    assert nodes_used(out) == 3
    assert store_rows(dataset) == expected

    ingest = ingest_on(cluster, run16, dataset)  # the same run again, replacing it
    while not list(tmp_path.glob(f"{dataset.name}.ingest-*/*/*.parquet")):  # a first task wrote its parts
        assert ingest.poll() is None, ingest.communicate()
        time.sleep(0.05)
    cluster.remove_node(next(iter(cluster.worker_nodes)), allow_graceful=False)  # 15 files' tasks to go: every
    assert ingest.poll() is None  # node runs one of them, as the ingest goes on
    out, err = ingest.communicate(timeout=600)
    assert ingest.returncode == 0 and f"-> {dataset}" in out, err
    assert 2 <= nodes_used(out) <= 3
    assert store_rows(dataset) == expected
