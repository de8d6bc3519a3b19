"""Arguments a user gets wrong (issue 11, class 8): one line naming the option or field, exit 2, nothing written."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import get_args

import click
import pytest
import typer
import yaml

from tests.conftest import ROOT, TRACES, run_main
from traceana.cli.options import JsonOption

GOOD = TRACES / "kineto" / "hta_rank0of2_pg_args.json.gz"
CONFIG = ROOT / "examples" / "dense70b_megatron_tp4pp2_32_h100.yaml"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("store") / "t.duckdb"
    assert run_main("ingest", GOOD, "--db", path)[0] == 0
    return path


def one_error(result: tuple[int, str, str]) -> str:
    code, _, err = result
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result
    return lines[0]


@pytest.mark.parametrize(("name", "message"), [
    ("missing/plot.png", "folder {tmp}/missing does not exist"),
    ("", "is a folder; give a file name ending in .png"),
    ("plot.bmpx", "unknown image type .bmpx; use .png, .svg, .pdf"),
    ("plot", "unknown image type (no extension)"),
])
def test_plot_path_is_checked_before_any_work_for_every_command(store, tmp_path, name, message) -> None:
    plot = tmp_path / name if name else tmp_path
    commands = (["breakdown", "--db", store], ["timeline", "--step", "1", "--db", store], ["estimate", CONFIG],
                ["compare", CONFIG, "--db", store])
    for args in commands:
        line = one_error(run_main(*args, "--plot", plot))
        assert f"--plot {plot}: " in line and message.format(tmp=tmp_path) in line, (args, line)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no DIR.png, no partial file


@pytest.mark.parametrize(("name", "message"), [
    ("missing/report.html", "folder {tmp}/missing does not exist"),
    ("", "is a folder; give a file name ending in .html"),
    ("report.png", "unknown page type .png; use .html, .htm"),
])
def test_html_path_is_checked_before_the_report_is_computed(store, tmp_path, name, message) -> None:
    page = tmp_path / name if name else tmp_path
    run = "hta_rank0of2_pg_args"
    for args in (["report", "--db", store], ["diff", run, run, "--db", store]):
        line = one_error(run_main(*args, "--html", page))
        assert f"--html {page}: " in line and message.format(tmp=tmp_path) in line, (args, line)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_plot_into_a_folder_that_cannot_be_written_is_one_line(store, tmp_path) -> None:
    """Root may write anywhere, so the refusal comes from the file system: a name longer than it allows."""
    plot = tmp_path / ("x" * 300 + ".png")
    assert "cannot write the plot (File name too long)" in one_error(run_main("breakdown", "--db", store,
                                                                              "--plot", plot))


def test_sql_empty_or_no_statement(store) -> None:
    assert one_error(run_main("sql", "", "--db", store)) == "error: sql: the query is empty"
    assert one_error(run_main("sql", ";", "--db", store)) == "error: sql: the query is empty"


def test_layout_with_a_repeated_key(store, tmp_path) -> None:
    line = one_error(run_main("ingest", GOOD, "--db", tmp_path / "t.duckdb", "--layout", "tp=2,tp=4"))
    assert line == "error: layout 'tp=2,tp=4': tp is given twice"


def test_step_marker_on_a_format_that_ignores_it_says_so(tmp_path) -> None:
    code, out, err = run_main("ingest", GOOD, "--db", tmp_path / "t.duckdb", "--step-marker", "iter")
    assert code == 0, err
    assert "note: --step-marker 'iter' ignored: Kineto steps are the profiler's ProfilerStep#N" in out


def test_binary_or_malformed_rules_file(tmp_path) -> None:
    rules = tmp_path / "rules.csv"
    rules.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00binary")
    line = one_error(run_main("ingest", GOOD, "--db", tmp_path / "t.duckdb", "--rules", rules))
    assert line == f"error: {rules}: not a text file (rules are CSV: pattern,category,op)"
    rules.write_text("pattern,category,op\nnccl\n")
    assert f"{rules}:2: needs the columns pattern,category,op" in one_error(
        run_main("ingest", GOOD, "--db", tmp_path / "t.duckdb", "--rules", rules))
    assert not (tmp_path / "t.duckdb").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_threshold_must_be_a_finite_percentage(store, value) -> None:
    assert "must be a finite percentage >= 0" in one_error(run_main("stragglers", "--db", store,
                                                                    "--threshold", value))


@pytest.mark.parametrize(("section", "field", "value", "message"), [
    ("hardware", "peak_tflops_bf16", float("nan"), "hardware.peak_tflops_bf16: expected a finite number, got nan"),
    ("hardware", "peak_tflops_bf16", float("inf"), "hardware.peak_tflops_bf16: expected a finite number, got inf"),
    ("hardware", "peak_tflops_bf16", -989.0, "hardware.peak_tflops_bf16=-989.0: must be positive"),
    ("hardware", "bandwidth_gb_per_s", {"intra": -1, "inter": 25}, "hardware.bandwidth_gb_per_s.intra=-1.0: must be"),
    ("hardware", "bandwidth_gb_per_s", {"intra": 150, "inter": float("nan")},
     "hardware.bandwidth_gb_per_s.inter: expected a finite number, got nan"),
    ("model", "hidden", 10**23, "model.hidden=100000000000000000000000: beyond any real training job"),
    ("model", "seq_len", 10**12, "model.seq_len=1000000000000: beyond any real training job"),
])
def test_estimator_config_values_beyond_reason_name_the_field(tmp_path, section, field, value, message) -> None:
    raw = yaml.safe_load(CONFIG.read_text())
    raw[section][field] = value
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    line = one_error(run_main("estimate", path))
    assert f"{path}: {message}" in line


def test_ingest_into_a_folder_that_is_not_a_dataset_is_one_line(tmp_path) -> None:
    target = tmp_path / "store"
    target.mkdir()
    (target / "notes.txt").write_text("mine\n")
    assert "a folder but not a traceana Parquet dataset" in one_error(run_main("ingest", GOOD, "--db", target))
    assert [p.name for p in target.iterdir()] == ["notes.txt"]
    shutil.rmtree(target)


# One vocabulary (issue 36): the options many commands share are walked from the typer app, so that a command added
# later is held to them too. Running: the arguments each command needs besides the option under test.
NEEDS = {"timeline": ["--plot", "{tmp}/t.png"], "whatif": ["--change", "kernel=*:0.9"]}
STEP_COMMANDS = {"breakdown", "timeline", "critical-path", "ops", "idle", "replay", "whatif", "advise"}


def shared(option: str) -> list[tuple[str, click.Parameter]]:
    """(command, parameter) for every command of the app that has ``option``."""
    from traceana.cli.main import app

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]  (a group: the app has commands)
    return [(name, p) for name, command in commands.items() for p in command.params if option in p.opts]


def test_every_step_takes_median_and_says_which_step_it_is(store, tmp_path) -> None:
    found = shared("--step")
    assert {name for name, _ in found} == STEP_COMMANDS
    for name, _ in found:
        needs = [a.format(tmp=tmp_path) for a in NEEDS.get(name, [])]
        code, out, err = run_main(name, "--step", "median", *needs, "--db", store)
        assert code == 0 and "the median step" in out + err, (name, code, err)


def test_every_step_refuses_other_words_naming_the_forms(store) -> None:
    for name, param in shared("--step"):
        every = "all" in (param.metavar or "")  # replay: every step is its default, 'all' says so
        forms = "a step number, 'median' or 'all'" if every else "a step number or 'median'"
        assert one_error(run_main(name, "--step", "middle", "--db", store)) == f"error: --step 'middle': give {forms}"
        if not every:
            assert one_error(run_main(name, "--step", "all", "--db", store)) == f"error: --step 'all': give {forms}"


def test_every_top_refuses_zero_before_any_work() -> None:
    found = shared("--top")
    assert len(found) >= 5
    for name, param in found:
        assert param.callback is not None and param.callback.__name__ == "top_count", name
        assert one_error(run_main(name, "--top", "0")) == "error: --top 0: must be at least 1", name


def test_every_json_plot_and_by_reads_the_same() -> None:
    json_help = get_args(JsonOption)[1].help
    for name, param in shared("--json"):
        assert param.is_flag and param.help == json_help, name  # type: ignore[attr-defined]
    for name, param in shared("--plot"):
        assert param.callback is not None and param.callback.__name__ == "plot_path", name
        assert re.fullmatch(r"Write .+ to this PNG \(or \.svg, \.pdf\)\.", param.help or ""), (name, param.help)


def test_every_by_lists_its_choices_in_help_and_error(store) -> None:
    for name, param in shared("--by"):
        line = one_error(run_main(name, "--by", "bogus", "--db", store))
        choices = re.split(r", | or ", line.split(": choose ")[-1].removeprefix("one of "))
        assert len(choices) > 1 and all(c in (param.help or "") for c in choices), (name, line, param.help)
