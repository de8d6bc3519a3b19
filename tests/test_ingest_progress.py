"""The ingest progress bar counts the files it reads and their bytes, not the arguments, and names what follows."""

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
