"""`traceana export --perfetto`: Trace Event Format JSON whose structure and counts match the store."""

from __future__ import annotations

import gzip
import itertools
import json
from collections import Counter, defaultdict
from pathlib import Path

import duckdb
import pytest

from tests.conftest import SAMPLES, TRACES, run_cli
from traceana.render.perfetto import CNAME

TOY = "toy8_tp2pp2dp2_1f1b"
SAMPLED = [TRACES / "kineto" / f"hta_sampled_rank{r}of128.json.gz" for r in (0, 1)]  # GPU, NCCL SendRecv


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("perfetto") / "p.duckdb"
    run_cli("ingest", SAMPLES / TOY, "--layout", "tp=2,pp=2,dp=2", "--db", path)
    if all(p.exists() for p in SAMPLED):
        run_cli("ingest", *SAMPLED, "--db", path, "--run-id", "sampled")
    return path


def export(db: Path, out: Path, *args: str, run: str = TOY) -> dict:
    said = run_cli("export", run, "--perfetto", out, "--db", db, *args).stdout
    assert said.startswith(f"wrote {out} ({run}: ")
    opener = gzip.open if out.suffix == ".gz" else open
    with opener(out, "rt", encoding="utf-8") as f:
        return json.load(f)


def store(db: Path, sql: str, *params: object) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, list(params)).fetchall()


def check_structure(trace: dict) -> dict[str, list[dict]]:
    """Valid Trace Event Format: known phases with their fields; slices of one track never overlap partially;
    every flow event sits at the start of a slice on its track; each flow has one start and one finish."""
    events = trace["traceEvents"]
    by_phase: dict[str, list[dict]] = defaultdict(list)
    for event in events:
        by_phase[event["ph"]].append(event)
    assert set(by_phase) <= {"M", "X", "s", "t", "f"}
    tracks: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for x in by_phase["X"]:
        assert isinstance(x["pid"], int) and isinstance(x["tid"], int) and x["ts"] >= 0 and x["dur"] >= 0
        tracks[x["pid"], x["tid"]].append((x["ts"], x["ts"] + x["dur"]))
    for spans in tracks.values():
        spans.sort()
        # disjoint on every track (1e-6 µs: ts + dur of adjacent slices, each the double nearest a whole ns, may
        # sum one ulp past the next ts; the critical path's slices tile their step exactly)
        assert all(b[0] >= a[1] - 1e-6 for a, b in itertools.pairwise(spans))
    starts = {(x["pid"], x["tid"], x["ts"]) for x in by_phase["X"]}
    flows = Counter()
    for phase in "stf":
        for event in by_phase[phase]:
            assert (event["pid"], event["tid"], event["ts"]) in starts and event["bp"] == "e"
            flows[event["id"], phase] += 1
    ids = {i for i, _ in flows}
    assert all(flows[i, "s"] == 1 and flows[i, "f"] == 1 for i in ids)
    named = {(m["pid"], m["tid"]) for m in by_phase["M"] if m["name"] == "thread_name"}
    assert set(tracks) <= named  # every track has a name
    return by_phase


def test_toy_run_matches_the_store(db: Path, tmp_path: Path) -> None:
    trace = export(db, tmp_path / "toy.json")
    phases = check_structure(trace)
    names = {m["pid"]: m["args"]["name"] for m in phases["M"] if m["name"] == "process_name"}
    coords = store(db, "SELECT rank, tp, dp, pp FROM ranks WHERE run_id = ? ORDER BY rank", TOY)
    assert names == {r: f"rank {r} · tp{tp} dp{dp} pp{pp}" for r, tp, dp, pp in coords} | {8: "critical path"}
    assert names[5] == "rank 5 · tp1 dp0 pp1"  # tp fastest, then dp, then pp (tp=2,pp=2,dp=2)
    slices = [x for x in phases["X"] if x["cat"] not in ("step", "critical_path")]
    per_rank = Counter(x["pid"] for x in slices)
    assert per_rank == dict(store(db, "SELECT rank, count(*) FROM device_events WHERE run_id = ? GROUP BY rank", TOY))
    comm = [x for x in slices if x["cat"] == "comm"]
    assert len(comm) == store(db, "SELECT count(*) FROM device_events WHERE run_id = ? AND category = 'comm'",
                              TOY)[0][0]
    # coloured by dim as the plots: the name says the dim, cname is that dim's colour
    dims = Counter(x["name"].split()[0] for x in comm)
    assert dims == dict(store(db, "SELECT dim, count(*) FROM collectives WHERE run_id = ? GROUP BY dim", TOY))
    assert all(x["cname"] == CNAME[x["name"].split()[0]] for x in comm)
    steps = [x for x in phases["X"] if x["cat"] == "step"]
    assert sorted((x["pid"], x["args"]["step"]) for x in steps) == sorted(
        store(db, "SELECT rank, step FROM step_windows WHERE run_id = ?", TOY))
    # one arrow chain per collective instance seen on at least two ranks, one event per member
    flow_ids = {e["id"] for e in phases["s"]}
    instances = store(db, "SELECT instance, ranks_seen FROM collective_instances WHERE run_id = ? AND ranks_seen > 1",
                      TOY)
    assert flow_ids == {i for i, _ in instances}
    assert len(phases["s"]) + len(phases["t"]) + len(phases["f"]) == sum(n for _, n in instances)
    # times: µs since the first event, on the store's clock
    assert trace["otherData"]["t0_ns"] == store(db, "SELECT min(start_ns) FROM step_windows WHERE run_id = ?",
                                                 TOY)[0][0]
    assert min(x["ts"] for x in phases["X"]) == 0
    # the critical path: its own process above the ranks, one track per step, one slice per segment of the path
    # `traceana critical-path` walks, in the same order, tiling the same length
    path = [x for x in phases["X"] if x["cat"] == "critical_path"]
    assert {x["pid"] for x in path} == {8}
    for step in (2, 3):
        walked = json.loads(run_cli("critical-path", TOY, "--step", step, "--json", "--db", db).stdout)
        mine = sorted((x for x in path if x["tid"] == step), key=lambda x: x["ts"])
        assert len(mine) == len(walked["segments"]) > 100
        assert [(x["args"]["rank"], x["args"]["kind"]) for x in mine] == [
            (s["rank"], s["kind"]) for s in walked["segments"]]
        assert sum(x["dur"] for x in mine) == pytest.approx(walked["length_ms"] * 1e3, abs=1e-3)


def test_steps_window_and_gzip(db: Path, tmp_path: Path) -> None:
    trace = export(db, tmp_path / "step3.json.gz", "--steps", "3-3")
    phases = check_structure(trace)
    assert {x["args"]["step"] for x in phases["X"] if x["cat"] == "step"} == {3}
    expected = store(db, "SELECT count(*) FROM device_events e JOIN step_windows w USING (run_id, rank) "
                         "WHERE run_id = ? AND w.step = 3 AND e.end_ns > w.start_ns AND e.start_ns < w.end_ns", TOY)
    assert len([x for x in phases["X"] if x["cat"] not in ("step", "critical_path")]) == expected[0][0]
    assert {x["tid"] for x in phases["X"] if x["cat"] == "critical_path"} == {3}


def test_a_real_gpu_run(db: Path, tmp_path: Path) -> None:
    if not all(p.exists() for p in SAMPLED):
        pytest.skip(f"{SAMPLED[0]} is not here")
    phases = check_structure(export(db, tmp_path / "sampled.json", run="sampled"))
    kernels = store(db, "SELECT count(*), count(*) FILTER (WHERE category = 'comm') FROM device_events "
                        "WHERE run_id = 'sampled'")[0]
    slices = [x for x in phases["X"] if x["cat"] not in ("step", "critical_path")]
    assert (len(slices), len([x for x in slices if x["cat"] == "comm"])) == kernels
    # 10 SendRecv instances, each seen on both ranks: 10 arrows of two members
    assert kernels[1] == 20 and len(phases["s"]) == len(phases["f"]) == 10 and not phases["t"]
    # GPU kernels of one stream never overlap: every stream is one track, no sub-tracks were needed
    tracks = {m["args"]["name"] for m in phases["M"] if m["name"] == "thread_name"}
    assert not any(name.endswith(")") for name in tracks)


@pytest.mark.parametrize(("args", "message"), [
    (("--steps", "9-9"), "--steps 9-9: run 'toy8_tp2pp2dp2_1f1b' has no such steps (steps: 2, 3)"),
    (("--steps", "3-x"), "--steps '3-x': expected A-B or A"),
    ((), "choose what to write: --perfetto"),
])
def test_mistakes_are_one_line_errors(db: Path, tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    output = () if not args else ("--perfetto", tmp_path / "x.json")
    result = run_cli("export", TOY, *output, *args, "--db", db, check=False)
    assert result.returncode == 2 and result.stderr.startswith(f"error: {message}")
    assert result.stderr.count("\n") == 1 and not (tmp_path / "x.json").exists()


def test_events_outside_every_window_are_counted_in_a_note(tmp_path: Path) -> None:
    """Issue 23 §3(e): hta_rank0of16's 899 device events before its first or after its last step window are not
    in the file, and the export says so: the file's slices plus that count are the raw JSON's kernels, memcpys and
    memsets (6,080 + 1,390 + 277 = 7,747)."""
    name = "hta_rank0of16_a2a_rs_ag.json.gz"
    db, out = tmp_path / "t.duckdb", tmp_path / "out.json"
    run_cli("ingest", TRACES / "kineto" / name, "--db", db, "--run-id", "a2a")
    said = run_cli("export", "a2a", "--perfetto", out, "--db", db).stdout
    with gzip.open(TRACES / "kineto" / name) as handle:
        raw = sum(e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                  for e in json.load(handle)["traceEvents"])
    events = json.loads(out.read_text())["traceEvents"]
    written = sum(e["ph"] == "X" and e["pid"] == 0 and e["tid"] != 0 for e in events)  # rank 0, not its steps
    assert (raw, written) == (7747, 6848)
    assert f"note: {raw - written} device events outside the exported step windows are not in the file" in said
