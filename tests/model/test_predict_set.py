"""`predict --set KEY=VALUE`: the target is --config with those keys changed, the same prediction as the YAML that
says so (--to), and a malformed change is one line. Without --config, the run's config is inferred from its trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT, SAMPLES, TRACES, ingested, one_line, run_cli, run_main
from tests.test_sample_traces import EXPERIMENTS

CONFIGS = SAMPLES.parent / "configs"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kineto = TRACES / "kineto"
    return ingested(tmp_path_factory.mktemp("set") / "t.duckdb",
                    {"pp2_mb1": (SAMPLES / "pp2_mb1", EXPERIMENTS["pp2_mb1"][0]),
                     "h200_gpt": (kineto / "h200_gpt_h2048_L8_s1024_gb4.json.gz", None),
                     "h200_hostbound": (kineto / "h200_hostbound_h512_L12_s256_gb8.json.gz", None),
                     "hta_rank3of8": (kineto / "hta_rank3of8_6steps.json.gz", None)})


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


def test_the_config_inferred_from_the_h200_trace_is_the_jobs(db: Path) -> None:
    """The H200 GPT trace records its operators' shapes: the model and batch read from them are the job's, as
    examples/h200_gpt_h2048_L8.yaml gives it from the recording script (8 layers, hidden 2048, 16 heads, GeLU MLP 8192,
    vocabulary 50304, sequence 1024, two micro-batches of 2)."""
    from traceana import store
    from traceana.analyses.job import infer
    from traceana.estimator.config import from_dict, load

    with store.connect(db, read_only=True) as con:
        job = infer(con, "h200_gpt")
    inferred, written = from_dict(job.raw), load(ROOT / "examples" / "h200_gpt_h2048_L8.yaml")
    for field in ("layers", "hidden", "ffn_hidden", "heads", "kv", "hd", "vocab", "seq_len", "gated_mlp"):
        assert getattr(inferred.model, field) == getattr(written.model, field), field
    assert inferred.parallel == written.parallel
    assert inferred.hardware == written.hardware


def test_predict_without_a_config_infers_it_and_says_so(db: Path) -> None:
    """The same change predicted from the inferred config and from the hand-written one: the step within 1% (what
    the inference cannot read, precision and tied embeddings, moves the memory, not the time), the notes naming
    what was inferred and what assumed."""
    common = ("predict", "h200_gpt", "--set", "parallel.micro_batch=1", "--db", db, "--json")
    inferred = json.loads(run_cli(*common).stdout)
    written = json.loads(run_cli(*common, "--config", ROOT / "examples" / "h200_gpt_h2048_L8.yaml").stdout)
    (a, measured), (b, _) = (next((r["predicted_B_ms"], r["measured_A_ms"]) for r in p["step"] if r["dim"] == "TOTAL")
                             for p in (inferred, written))
    assert a == pytest.approx(b, rel=0.01) and abs(a / measured - 1) > 0.1  # the change matters
    assert any(n.startswith("--config inferred from the trace") and "8 layers" in n for n in inferred["notes"])
    assert any(n.startswith("assumed") for n in inferred["notes"])


@pytest.mark.parametrize(("run", "message"), [
    ("h200_hostbound", "records no attention operator with its shapes"),  # profiled without record_shapes
    ("hta_rank3of8", "has 8 ranks and no layout"),
    ("pp2_mb1", "no built-in hardware profile for its device"),  # a CPU run
])
def test_what_cannot_be_inferred_is_one_line(db: Path, run: str, message: str) -> None:
    code, _, err = run_main("predict", run, "--set", "parallel.micro_batch=1", "--db", db)
    assert message in one_line(code, err) and "give --config" in err
