"""What ingest tells the user: a progress bar over the files it reads and their bytes (not the arguments), the
phases after reading by name, and how the steps were found."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SAMPLES, TRACES
from traceana.ingest.dispatch import IngestOptions, ReadProgress, read_run


class Recorder(ReadProgress):
    def __init__(self) -> None:
        self.announced: list[Path] = []
        self.done: list[Path] = []
        self.phases: list[str] = []

    def files(self, paths: list[Path]) -> None:
        self.announced = list(paths)

    def read(self, path: Path) -> None:
        self.done.append(path)

    def phase(self, name: str) -> None:
        self.phases.append(name)


@pytest.mark.parametrize(("folder", "pattern"), [
    (SAMPLES / "toy8_tp2pp2dp2_1f1b", "rank*.json.gz"),                      # one folder argument, 8 files
    (TRACES / "ascend" / "torch_npu_2rank_level1_db", "*_ascend_pt/*/ascend_pytorch_profiler_*.db"),  # one a rank
])
def test_progress_counts_files_and_bytes(folder: Path, pattern: str) -> None:
    if not folder.exists():
        pytest.skip(f"{folder} is not here")
    recorder = Recorder()
    read_run([folder], "auto", IngestOptions(progress=recorder))
    expected = sorted(p.resolve() for p in folder.glob(pattern))
    assert sorted(p.resolve() for p in recorder.done) == expected
    assert sorted(p.resolve() for p in recorder.announced) == expected
    assert len(recorder.done) > 1  # more files than the one folder argument
    assert recorder.phases[-1] == "assigning coordinates, process groups and collective instances"
    assert len(recorder.phases) == 2  # the format's own work after reading is named too


@pytest.mark.parametrize(("trace", "says"), [
    # no ProfilerStep# annotation anywhere in the file (zcat | grep -c ProfilerStep: 0)
    ("tracelens_b200_rank0of8_vllm", "no step markers: the whole trace is analysed as one step"),
    ("hta_rank0of2_pg_args", "3 steps (3 rank-steps)"),  # ProfilerStep#4, #5, #6 on its one rank
])
def test_ingest_says_how_steps_were_found(cli, tmp_path: Path, trace: str, says: str) -> None:  # type: ignore[no-untyped-def]
    path = TRACES / "kineto" / f"{trace}.json.gz"
    if not path.exists():
        pytest.skip(f"{path} is not here")
    assert says in cli("ingest", path, "--db", tmp_path / "s.duckdb").stdout
