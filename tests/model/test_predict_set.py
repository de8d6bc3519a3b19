"""`predict --set KEY=VALUE`: the target is --config with those keys changed, the same prediction as the YAML that
says so (--to), and a malformed change is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, ingested, one_line, run_cli, run_main
from tests.test_sample_traces import EXPERIMENTS

CONFIGS = SAMPLES.parent / "configs"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ingested(tmp_path_factory.mktemp("set") / "t.duckdb",
                    {"pp2_mb1": (SAMPLES / "pp2_mb1", EXPERIMENTS["pp2_mb1"][0])})


def test_set_equals_the_yaml_that_says_so(db: Path) -> None:
    # pp2_mb8.yaml is pp2_mb1.yaml with parallel.micro_batch 1 instead of 8, and nothing else
    base, other = ((CONFIGS / f"{n}.yaml").read_text().splitlines()[1:] for n in ("pp2_mb1", "pp2_mb8"))
    assert [(a, b) for a, b in zip(base, other, strict=True) if a != b] == [("  micro_batch: 8", "  micro_batch: 1")]
    common = ("predict", "pp2_mb1", "--config", CONFIGS / "pp2_mb1.yaml", "--db", db, "--json")
    by_yaml = json.loads(run_cli(*common, "--to", CONFIGS / "pp2_mb8.yaml").stdout)
    by_set = json.loads(run_cli(*common, "--set", "parallel.micro_batch=1").stdout)
    assert by_set["step"] == by_yaml["step"] and by_set["stages"] == by_yaml["stages"]
    assert by_set["memory"] == by_yaml["memory"]
    unchanged = json.loads(run_cli(*common, "--set", "parallel.micro_batch=8").stdout)
    assert unchanged["step"] != by_yaml["step"]


@pytest.mark.parametrize(("change", "message"), [
    ("micro_batch=1", "expected SECTION.KEY=VALUE"),
    ("parallel.micro_batch", "expected SECTION.KEY=VALUE"),
    ("parallel.micro_batch=[1", "the value is not YAML"),
    ("parallel.micro_batch.x=1", "micro_batch is not a section"),
])
def test_bad_changes_are_one_line(db: Path, change: str, message: str) -> None:
    code, _, err = run_main("predict", "pp2_mb1", "--config", CONFIGS / "pp2_mb1.yaml", "--set", change, "--db", db)
    assert message in one_line(code, err)


def test_a_target_is_needed(db: Path) -> None:
    code, _, err = run_main("predict", "pp2_mb1", "--config", CONFIGS / "pp2_mb1.yaml", "--db", db)
    assert "--to CFG_B, or --set" in one_line(code, err)
