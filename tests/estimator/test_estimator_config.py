"""The job YAML: every example loads, and every mistake is one TraceanaError naming the field at fault."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from traceana.errors import TraceanaError
from traceana.estimator.config import from_dict, load, load_runs

ROOT = Path(__file__).resolve().parents[2]
# job configs (a sweep file naming other configs, for `compare`, has no model section of its own)
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml") if "model" in yaml.safe_load(p.read_text()))

BASE: dict[str, Any] = {
    "model": {"layers": 8, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "vocab": 32000, "seq_len": 2048,
              "experts": 16, "moe_topk": 2, "expert_ffn_hidden": 1024, "first_dense_layers": 1},
    "parallel": {"tp": 2, "pp": 2, "dp": 4, "ep": 4, "micro_batch": 1, "global_batch": 32},
    "schedule": {"kind": "1f1b"},
    "hardware": {"peak_tflops_bf16": 989, "hbm_gb": 80, "devices_per_node": 8},
}


def cfg_with(**changes: Any) -> dict[str, Any]:
    """BASE with ``section__field=value`` changes (``schedule__recompute`` takes a dict)."""
    raw = copy.deepcopy(BASE)
    for key, value in changes.items():
        section, name = key.split("__")
        raw.setdefault(section, {})[name] = value
    return raw


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_loads(path: Path) -> None:
    cfg = load(path)
    assert cfg.parallel.world_size >= 1
    for run in load_runs(path):
        assert run.config.model == cfg.model


def test_design_example_reads_as_written() -> None:
    cfg = load(ROOT / "examples" / "deepseek_v3.yaml")
    assert (cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.ep) == (1, 16, 128, 64)
    assert cfg.parallel.world_size == 2048 and cfg.micro_batches == 4096 // 128
    assert cfg.calibration.overlap.dp == 0.9 and cfg.calibration.safety_buffer_mb == 1024
    assert cfg.schedule.recompute.kind == "selective" and cfg.schedule.recompute.layers is None


def test_runs_override_the_base_and_carry_measurements() -> None:
    runs = load_runs(ROOT / "examples" / "deepseek_v3_reduced.yaml")
    assert [r.name for r in runs] == list("ABCDEF")
    assert [(r.config.parallel.ep, r.config.parallel.tp) for r in runs] == [(2, 1), (4, 1), (8, 1), (4, 2), (2, 2),
                                                                            (8, 2)]
    assert runs[0].measured == {"peak_memory_mb": 10941.0}
    assert all(r.config.parallel.world_size == 32 for r in runs)


@pytest.mark.parametrize(("changes", "message"), [
    ({"parallel__pp": 16, "parallel__dp": 1}, "parallel.pp=16 exceeds model.layers=8"),  # AP-PP-06
    ({"parallel__global_batch": 30}, "parallel.global_batch=30 is not divisible by parallel.dp x parallel.micro_batch"),
    ({"parallel__ep": 3}, "parallel.ep=3 does not divide model.experts=16"),
    ({"parallel__ep": 16}, "ep=16 x etp=2 does not divide tp*cp*dp=8"),
    ({"hardware__devices": 64}, "hardware.devices=64 but parallel tp x cp x dp x pp = 2 x 1 x 4 x 2 = 16"),
    ({"parallel__dp": 3, "parallel__ep": 1, "parallel__global_batch": 6},
     "12 devices do not fill whole nodes of hardware.devices_per_node=8"),
    ({"schedule__recompute": {"kind": "full", "layers": [0, 8]}}, "schedule.recompute.layers: layer 8 does not exist"),
    ({"schedule__recompute": {"kind": "sometimes"}}, "schedule.recompute.kind='sometimes'"),  # AP-PP-10
    ({"schedule__stage_layers": [3, 4]}, "schedule.stage_layers: covers 7 layers, the model has 8"),  # AP-PP-05
    ({"schedule__stage_layers": [8, 0]}, "stage 1 would get 0 layers"),
    ({"schedule__layer_offset": [1, 1]}, "schedule.layer_offset: sums to 2, must be layers % pp"),  # AP-PP-08
    ({"schedule__layer_offset": [-4, 4]}, "stage 0 would get 0 layers"),
    ({"schedule__stage_layers": "balanced"}, "a list of layer counts, or 'ppb'"),
    ({"schedule__kind": "interleaved"}, "parallel.vpp: interleaved needs vpp >= 2"),
    ({"schedule__kind": "interleaved", "parallel__vpp": 2, "parallel__global_batch": 12},
     "micro_batches: interleaved needs a multiple of pp=2"),
    ({"schedule__kind": "dualpipe", "parallel__global_batch": 12}, "micro_batches: dualpipe needs"),
    ({"schedule__kind": "zigzag"}, "schedule.kind='zigzag'"),
    ({"schedule__p2p": "eager"}, "schedule.p2p='eager': choose one of auto, blocking, async"),
    ({"schedule__kind": "interleaved", "parallel__vpp": 2, "schedule__p2p": "blocking"},
     "schedule.p2p=blocking is modelled for gpipe, 1f1b, not interleaved"),
    ({"model__moe_topk": 0}, "model.moe_topk=0: must be between 1 and model.experts=16"),
    ({"model__heads": 12}, "model.hidden=1024 is not divisible by model.heads=12"),
    ({"model__hidden": -1}, "model.hidden=-1: must be positive"),
    ({"model__hiden": 1024}, "model.hiden: unknown field"),
    ({"parallel__tp": "two"}, "parallel.tp: expected an integer, got 'two'"),
    ({"parallel__sequence_parallel": "yes"}, "parallel.sequence_parallel: expected true or false"),
    ({"calibration__overlap": {"dp": 1.5}}, "calibration.overlap.dp=1.5: must be between 0 and 1"),
    ({"calibration__matmul_efficiency": 0}, "calibration.matmul_efficiency=0.0: must be in (0, 1]"),
    ({"calibration__safety_buffer_mb": -1}, "calibration.safety_buffer_mb=-1.0: must be >= 0"),
    ({"parallel__zero_shard": 2}, "parallel.zero_shard=2: needs zero: 3"),
    ({"parallel__cp_algo": "tree"}, "parallel.cp_algo='tree'"),
    ({"hardware__collectives": "mpi"}, "hardware.collectives='mpi': choose one of nccl, gloo"),
    ({"model__expert_load": [1.5, 0.5]}, "model.expert_load has 2 values: give one per EP rank (parallel.ep=4)"),
    ({"model__expert_load": [2, 2, 0, 0]}, "model.expert_load=[2.0, 2.0, 0.0, 0.0]: every EP rank's load must be "
                                           "positive"),
    ({"model__expert_load": [2, 1, 1, 1]}, "loads relative to a balanced split average 1, these 1.25"),
    ({"model__expert_load": [1.75, 0.25, 1, 1], "model__capacity_factor": 1.25},
     "model.expert_load is dropless routing, model.capacity_factor=1.25 pads every expert to capacity"),
    ({"model__expert_load": "hot"}, "model.expert_load: expected a list, got 'hot'"),
])
def test_config_errors_name_the_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(TraceanaError) as err:
        from_dict(cfg_with(**changes), "job.yaml")
    assert str(err.value).startswith("job.yaml: ")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_section_and_file_errors(tmp_path: Path) -> None:
    raw = copy.deepcopy(BASE)
    del raw["hardware"]
    with pytest.raises(TraceanaError, match=r"job\.yaml: missing section 'hardware'"):
        from_dict(raw, "job.yaml")
    with pytest.raises(TraceanaError, match="cannot read"):
        load(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [1, 2\n")
    with pytest.raises(TraceanaError, match=r"bad\.yaml: not valid YAML"):
        load(bad)
    bad.write_text(yaml.safe_dump({**BASE, "runs": [{"parallel": {"tp": 1}}]}))
    with pytest.raises(TraceanaError, match=r"runs\[0\]: needs a name"):
        load_runs(bad)


def test_a_bad_run_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**BASE, "runs": [{"name": "wide", "parallel": {"ep": 5}}]}))
    with pytest.raises(TraceanaError, match=r"sweep.yaml runs\[wide\]: parallel.ep=5 does not divide"):
        load_runs(path)


def test_cli_reports_a_config_error_in_one_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg_with(parallel__pp=16, parallel__dp=1)))
    for command in ("estimate", "search"):
        result = cli(command, path, check=False)
        assert result.returncode == 2
        assert result.stderr.strip() == f"error: {path}: parallel.pp=16 exceeds model.layers=8"
