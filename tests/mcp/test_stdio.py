"""`traceana mcp` as a client meets it: a real subprocess over stdio, driven by the SDK's own ClientSession, on the
8-rank sample toy8. Its numbers are checked against `traceana breakdown / whatif / advise --json` run as separate
processes (the CLI's own code path), rounded as the server rounds (4 significant figures)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, SAMPLES, ingested, run_cli

mcp = pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install 'traceana[mcp]')")
anyio = pytest.importorskip("anyio")

RUN = "toy8_tp2pp2dp2_1f1b"
CONFIG = ROOT / "examples" / "synth_gpt_tp2pp2.yaml"
TOOLS = {"runs", "info", "breakdown", "stragglers", "critical_path", "comm", "kernels", "idle", "memory", "diff",
         "replay", "whatif", "advise", "predict", "sql", "report"}
PASSWD = "root:x:0:0"  # the first line of every Linux /etc/passwd


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ingested(tmp_path_factory.mktemp("mcp") / "toy8.duckdb", {RUN: (SAMPLES / RUN, None)})


@pytest.fixture(scope="module")
def ingested_digest(store: Path) -> str:
    """The store's bytes as ingested, before any server opened it."""
    return hashlib.sha256(store.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def output_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("out")


@pytest.fixture(scope="module")
async def session(store: Path, ingested_digest: str, output_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                  anyio_backend: str) -> AsyncIterator[Any]:
    """One server for the module (a start costs seconds): `traceana mcp` in a subprocess, its stderr to a file."""
    env = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "PYTHONPATH") if k in os.environ}
    params = mcp.StdioServerParameters(command=sys.executable, cwd=ROOT, env=env, args=[
        "-m", "traceana", "mcp", "--db", str(store), "--output-dir", str(output_dir), "--config", str(CONFIG)])
    errlog = tmp_path_factory.mktemp("log") / "stderr.txt"
    with errlog.open("w") as err:
        async with mcp.stdio_client(params, errlog=err) as (read, write), \
                mcp.ClientSession(read, write, read_timeout_seconds=120) as s:
            await s.initialize()
            yield s
    assert "Traceback" not in errlog.read_text()  # every failure below was a user's, answered as one line


async def call(session: Any, tool: str, **arguments: object) -> dict[str, Any]:
    """A tool's result, which must be a success, parsed."""
    with anyio.fail_after(180):
        result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content[0].text
    return json.loads(result.content[0].text)


async def error(session: Any, tool: str, one_line: bool = True, **arguments: object) -> str:
    """A tool's error text, which must be an error: the one line the CLI would print (not ``one_line``: the SDK's
    own schema check, which refused the arguments before the tool ran, in pydantic's lines)."""
    with anyio.fail_after(180):
        result = await session.call_tool(tool, arguments)
    assert result.is_error, result.content[0].text
    text = result.content[0].text
    assert ("\n" not in text or not one_line) and PASSWD not in text
    return text


def rounded(value: Any) -> Any:
    return float(f"{value:.4g}") if isinstance(value, float) else value


def cli_json(store: Path, *args: object) -> Any:
    return json.loads(run_cli(*args, "--db", store, "--json").stdout)


@pytest.mark.anyio
async def test_lists_every_tool_described_and_read_only(session: Any) -> None:
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert set(tools) == TOOLS
    for name, tool in tools.items():
        assert len(tool.description) > 80 and tool.input_schema["type"] == "object", name
        assert tool.annotations.read_only_hint is (name != "report"), name  # report writes into --output-dir
        assert tool.annotations.destructive_hint is False and tool.annotations.open_world_hint is False
        if name not in ("sql", "report", "predict"):
            assert "top" in tool.input_schema["properties"], name


@pytest.mark.anyio
async def test_breakdown_has_the_numbers_of_breakdown_json(session: Any, store: Path) -> None:
    for by in ("rank", "stage"):
        got = await call(session, "breakdown", run_id=RUN, by=by, top=100)
        expected = cli_json(store, "breakdown", RUN, "--by", by)
        key = "rank" if by == "rank" else "pp"
        rows = {row[key]: row for row in got[f"{by}s"]}
        assert got["run_id"] == RUN and got["step"].startswith("typical step") and len(rows) == len(expected)
        for want in expected:
            assert rows[want[key]] == {k: rounded(v) for k, v in want.items()}


@pytest.mark.anyio
async def test_whatif_and_advise_have_the_numbers_of_their_json(session: Any, store: Path) -> None:
    got = await call(session, "whatif", run_id=RUN, changes=["dim=TP:0.5", "dim=DP:0.5"], top=100)
    want = cli_json(store, "whatif", RUN, "--change", "dim=TP:0.5", "--change", "dim=DP:0.5")
    assert (got["step"], got["changes"]) == (want["step"], want["changes"])
    for field in ("measured_step_ms", "predicted_step_ms", "error_bar_ms"):
        assert got[field] == rounded(want[field]), field
    assert got["ranks"] == [{k: rounded(v) for k, v in row.items()} for row in want["ranks"]]

    got = await call(session, "advise", run_id=RUN)
    want = cli_json(store, "advise", RUN)
    assert got["step"] == want["step"] and len(got["findings"]) == len(want["findings"]) > 0
    assert [(f["change"], f["gain_ms"]) for f in got["findings"]] == [
        (f["change"], rounded(f["gain_ms"])) for f in want["findings"]]


@pytest.mark.anyio
async def test_two_calls_at_once_are_both_answered_right(session: Any) -> None:
    alone = [await call(session, "critical_path", run_id=RUN), await call(session, "comm", run_id=RUN)]
    together: list[dict[str, Any]] = [{}, {}]

    async def one(i: int, tool: str) -> None:
        together[i] = await call(session, tool, run_id=RUN)

    async with anyio.create_task_group() as group:
        group.start_soon(one, 0, "critical_path")
        group.start_soon(one, 1, "comm")
    assert together == alone


@pytest.mark.anyio
async def test_a_bad_call_is_an_error_and_the_server_goes_on(session: Any) -> None:
    assert "unknown run 'nope' (known: toy8_tp2pp2dp2_1f1b)" in await error(session, "breakdown", run_id="nope")
    assert "--change 'dim=TP'" in await error(session, "whatif", run_id=RUN, changes=["dim=TP"])
    assert "changes the store; got DELETE" in await error(session, "sql", query="DELETE FROM runs")
    assert "validation error" in await error(session, "breakdown", False, top=0)  # the schema refused it
    assert (await call(session, "runs"))["runs"][0]["run_id"] == RUN  # still serving


@pytest.mark.anyio
async def test_no_tool_reads_etc_passwd_by_config_or_report_path(session: Any, output_dir: Path) -> None:
    for tool, arguments in (("advise", {"config": "/etc/passwd"}),
                            ("predict", {"config": "/etc/passwd", "to": str(CONFIG)}),
                            ("predict", {"config": str(CONFIG), "to": f"{output_dir}{'/..' * 20}/etc/passwd"}),
                            ("report", {"file_name": "r.html", "estimate": "/etc/passwd"})):
        assert "not a config this server may read" in await error(session, tool, run_id=RUN, **arguments)
    for name in ("../../etc/passwd", "/etc/passwd", "..html/../x.html"):
        assert "validation error" in await error(session, "report", False, file_name=name)
    assert not list(output_dir.iterdir())


@pytest.mark.anyio
async def test_sql_cannot_read_etc_passwd_or_write(session: Any, tmp_path: Path) -> None:
    for query in ("SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM read_text('/etc/passwd')",
                  "SELECT * FROM glob('/etc/*')", f"COPY (SELECT 1) TO '{tmp_path}/x.csv'",
                  f"SELECT 1; COPY (SELECT 1) TO '{tmp_path}/y.csv'"):
        assert "sql reads the store's own files only" in (text := await error(session, "sql", query=query)) \
            or "never writes a file" in text
    assert not list(tmp_path.iterdir())
    assert (await call(session, "sql", query="SELECT count(*) AS n FROM runs"))["rows"] == [[1]]


@pytest.mark.anyio
async def test_report_writes_into_the_output_dir_only(session: Any, output_dir: Path) -> None:
    pytest.importorskip("bokeh", reason="the report extra is not installed")
    got = await call(session, "report", run_id=RUN, file_name="toy8.html")
    assert got["path"] == str(output_dir / "toy8.html") and got["bytes"] == (output_dir / "toy8.html").stat().st_size
    (output_dir / "toy8.html").unlink()


@pytest.mark.anyio
async def test_resources_and_the_diagnose_prompt(session: Any) -> None:
    tables = (await session.read_resource("traceana://schema")).contents[0].text
    assert tables.count("CREATE TABLE") >= 10
    views = (await session.read_resource("traceana://views")).contents[0].text
    view_files = sorted((ROOT / "queries").glob("*.sql"))
    assert all(f"{p.read_text().split(':', 1)[0].removeprefix('-- ')}:" in views for p in view_files)
    assert "rank_breakdown" in views and "TOTAL_ns" in views
    prompt = await session.get_prompt("diagnose", {"run_id": RUN})
    text = prompt.messages[0].content.text
    assert RUN in text and text.index("breakdown") < text.index("stragglers") < text.index("critical_path") \
        < text.index("advise")


def test_no_tool_changed_the_store(store: Path, ingested_digest: str) -> None:
    """Runs after the calls above (pytest keeps file order): the store's bytes are still those ingested."""
    assert hashlib.sha256(store.read_bytes()).hexdigest() == ingested_digest
