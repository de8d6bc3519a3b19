"""`traceana export --perfetto`: Trace Event Format JSON whose structure and counts match the store."""

from __future__ import annotations

import gzip
import itertools
import json
import sqlite3
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest

from tests.analyses.test_launches import raw_nvtx_launchers
from tests.conftest import SAMPLES, TRACES, add_run, ingested, run_cli
from traceana.render.perfetto import CNAME
from traceana.render.perfetto_host import HOST_TRACK
from traceana.store import connect

TOY = "toy8_tp2pp2dp2_1f1b"
SAMPLED = [TRACES / "kineto" / f"hta_sampled_rank{r}of128.json.gz" for r in (0, 1)]  # GPU, NCCL SendRecv


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = ingested(tmp_path_factory.mktemp("perfetto") / "p.duckdb", {TOY: (SAMPLES / TOY, "tp=2,pp=2,dp=2")})
    if all(p.exists() for p in SAMPLED):
        with connect(path) as con:
            add_run(con, "sampled", SAMPLED)
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
    """Valid Trace Event Format: known phases with their fields; slices of a device track never overlap partially,
    those of a host track nest; every collective flow event sits at the start of a slice on its track, a launch
    flow starts inside a host slice and ends at a device slice's start; each flow has one start and one finish."""
    events = trace["traceEvents"]
    by_phase: dict[str, list[dict]] = defaultdict(list)
    for event in events:
        by_phase[event["ph"]].append(event)
    assert set(by_phase) <= {"M", "X", "s", "t", "f"}
    tracks: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for x in by_phase["X"]:
        assert isinstance(x["pid"], int) and isinstance(x["tid"], int) and x["ts"] >= 0 and x["dur"] >= 0
        tracks[x["pid"], x["tid"]].append((x["ts"], x["ts"] + x["dur"]))
    for (_, tid), spans in tracks.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        # 1e-6 µs: ts + dur of adjacent slices, each the double nearest a whole ns, may sum one ulp past the next
        # ts; the critical path's slices tile their step exactly
        if tid >= HOST_TRACK:
            open_ends: list[float] = []
            for start, end in spans:
                while open_ends and open_ends[-1] <= start + 1e-6:
                    open_ends.pop()
                assert not open_ends or end <= open_ends[-1] + 1e-6  # inside the innermost open slice
                open_ends.append(end)
        else:
            assert all(b[0] >= a[1] - 1e-6 for a, b in itertools.pairwise(spans))
    starts = {(x["pid"], x["tid"], x["ts"]) for x in by_phase["X"]}
    flows = Counter()
    for phase in "stf":
        for event in by_phase[phase]:
            assert event["bp"] == "e" and event["cat"] in ("collective", "launch")
            if event["cat"] == "launch" and phase == "s":
                assert event["tid"] >= HOST_TRACK and any(a <= event["ts"] <= b for a, b in tracks[event["pid"],
                                                                                                     event["tid"]])
            else:
                assert (event["pid"], event["tid"], event["ts"]) in starts
            flows[event["cat"], event["id"], phase] += 1
    ids = {(c, i) for c, i, _ in flows}
    assert all(flows[c, i, "s"] == 1 and flows[c, i, "f"] == 1 for c, i in ids)
    named = {(m["pid"], m["tid"]) for m in by_phase["M"] if m["name"] == "thread_name"}
    assert set(tracks) <= named  # every track has a name
    return by_phase


def device_slices(phases: dict[str, list[dict]]) -> list[dict]:
    return [x for x in phases["X"] if x["cat"] not in ("step", "critical_path") and x["tid"] < HOST_TRACK]


def flows(phases: dict[str, list[dict]], phase: str, cat: str = "collective") -> list[dict]:
    return [e for e in phases[phase] if e["cat"] == cat]


def test_toy_run_matches_the_store(db: Path, tmp_path: Path) -> None:
    trace = export(db, tmp_path / "toy.json")
    phases = check_structure(trace)
    names = {m["pid"]: m["args"]["name"] for m in phases["M"] if m["name"] == "process_name"}
    coords = store(db, "SELECT rank, tp, dp, pp FROM ranks WHERE run_id = ? ORDER BY rank", TOY)
    assert names == {r: f"rank {r} · tp{tp} dp{dp} pp{pp}" for r, tp, dp, pp in coords} | {8: "critical path"}
    assert names[5] == "rank 5 · tp1 dp0 pp1"  # tp fastest, then dp, then pp (tp=2,pp=2,dp=2)
    slices = device_slices(phases)
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
    flow_ids = {e["id"] for e in flows(phases, "s")}
    instances = store(db, "SELECT instance, ranks_seen FROM collective_instances WHERE run_id = ? AND ranks_seen > 1",
                      TOY)
    assert flow_ids == {i for i, _ in instances}
    assert sum(len(flows(phases, ph)) for ph in "stf") == sum(n for _, n in instances)
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
    assert len(device_slices(phases)) == expected[0][0]
    assert {x["tid"] for x in phases["X"] if x["cat"] == "critical_path"} == {3}


def test_a_real_gpu_run(db: Path, tmp_path: Path) -> None:
    if not all(p.exists() for p in SAMPLED):
        pytest.skip(f"{SAMPLED[0]} is not here")
    phases = check_structure(export(db, tmp_path / "sampled.json", run="sampled"))
    kernels = store(db, "SELECT count(*), count(*) FILTER (WHERE category = 'comm') FROM device_events "
                        "WHERE run_id = 'sampled'")[0]
    slices = device_slices(phases)
    assert (len(slices), len([x for x in slices if x["cat"] == "comm"])) == kernels
    # 10 SendRecv instances, each seen on both ranks: 10 arrows of two members
    assert kernels[1] == 20 and len(flows(phases, "s")) == len(flows(phases, "f")) == 10 and not phases["t"]
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
    written = sum(e["ph"] == "X" and e["pid"] == 0 and 0 < e["tid"] < HOST_TRACK for e in events)  # its device
    assert (raw, written) == (7747, 6848)
    assert f"note: {raw - written} device events outside the exported step windows are not in the file" in said


def _innermost(slices: list[tuple[int, int, str]], times: list[int]) -> dict[int, tuple[int, int, str] | None]:
    """For each time, the innermost of nested slices (start, end, name) that holds it (ends included)."""
    order = sorted(slices, key=lambda s: (s[0], -s[1]))
    found: dict[int, tuple[int, int, str] | None] = {}
    stack: list[tuple[int, int, str]] = []
    i = 0
    for t in sorted(set(times)):
        while i < len(order) and order[i][0] <= t:
            while stack and stack[-1][1] < order[i][0]:
                stack.pop()
            stack.append(order[i])
            i += 1
        while stack and stack[-1][1] < t:
            stack.pop()
        found[t] = stack[-1] if stack else None
    return found


def _ns(ts: object) -> int:
    """A Trace Event Format time in µs (3 decimals: whole ns) as integer ns."""
    return int((Decimal(str(ts)) * 1000).to_integral_value())


def test_host_lanes_and_launch_arrows_match_the_raw_json(tmp_path: Path) -> None:
    """Issue 34 item 2 on the H200 trace: each CPU op of the raw JSON that overlaps the exported windows is a slice
    on its thread's host track, with its time; and every kernel has an arrow from the CPU op that launched it, the
    op the raw JSON's own launch flows (ac2g: runtime call -> kernel) reach by a second route: the innermost CPU op
    around that runtime call on its thread."""
    trace_file = TRACES / "kineto" / "h200_gpt_h2048_L8_s1024_gb4.json.gz"
    if not trace_file.exists():
        pytest.skip(f"{trace_file} is not here")
    db, out = tmp_path / "t.duckdb", tmp_path / "h200.json"
    run_cli("ingest", trace_file, "--db", db, "--run-id", "h200")
    said = run_cli("export", "h200", "--perfetto", out, "--db", db).stdout
    phases = check_structure(json.loads(out.read_text()))
    with gzip.open(trace_file) as handle:
        raw = json.load(handle, parse_float=Decimal)["traceEvents"]
    kernels = [e for e in raw if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    device = device_slices(phases)
    shift = min(_ns(e["ts"]) for e in kernels) - min(_ns(x["ts"]) for x in device)  # raw clock - exported
    lo, hi = (f(_ns(x["ts"]) + d * _ns(x["dur"]) for x in phases["X"] if x["cat"] == "step") for f, d in
              ((min, 0), (max, 1)))
    raw_ops = [(_ns(e["ts"]) - shift, _ns(e["ts"]) + _ns(e["dur"]) - shift, e["name"], e["tid"]) for e in raw
               if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    kept = [op for op in raw_ops if op[1] > lo and op[0] < hi]
    ours = [x for x in phases["X"] if x["cat"] == "cpu_op"]
    assert (len(raw_ops), len(ours)) == (9472, 9461)  # 11 ops lie outside both steps' windows
    assert Counter((_ns(x["ts"]), _ns(x["ts"]) + _ns(x["dur"]), x["name"], x["args"]["thread"]) for x in ours) == \
        Counter(kept)
    # the arrows: every kernel's, from the op the raw launch flow leads to
    flows_s = {e["id"]: e for e in flows(phases, "s", "launch")}
    flows_f = {e["id"]: e for e in flows(phases, "f", "launch")}
    assert len(flows_s) == len(flows_f) == len(device) == len(kernels) == 1828
    assert f"{len(ours) + 6} host ranges on 3 host tracks, 1828 kernels linked to their launching host range" in said
    host = defaultdict(list)
    for x in phases["X"]:
        if x["tid"] >= HOST_TRACK:
            host[x["tid"]].append((_ns(x["ts"]), _ns(x["ts"]) + _ns(x["dur"]), x["name"]))
    starts = defaultdict(list)
    for i, s in flows_s.items():
        starts[s["tid"]].append((_ns(flows_f[i]["ts"]), _ns(s["ts"])))
    exported = {}
    for tid, pairs in starts.items():
        around = _innermost(host[tid], [t for _, t in pairs])
        exported |= {kernel: around[t] for kernel, t in pairs}
    f_at = {(e["pid"], e["tid"], e["ts"]): e["id"] for e in raw if e.get("cat") == "ac2g" and e["ph"] == "f"}
    s_of = {e["id"]: e for e in raw if e.get("cat") == "ac2g" and e["ph"] == "s"}
    calls = defaultdict(list)  # thread -> (kernel start, runtime call), on the exported clock
    for k in kernels:
        s = s_of[f_at[k["pid"], k["tid"], k["ts"]]]
        calls[s["tid"]].append((_ns(k["ts"]) - shift, _ns(s["ts"]) - shift))
    by_kineto = {}
    for tid, pairs in calls.items():
        around = _innermost([op[:3] for op in raw_ops if op[3] == tid], [t for _, t in pairs])
        by_kineto |= {kernel: around[t] for kernel, t in pairs}
    assert len(by_kineto) == 1828 and exported == by_kineto
    assert Counter(op[2] for op in exported.values()).most_common(2) == [("aten::mm", 404), ("aten::add_", 264)]


def test_nvtx_lanes_and_launch_arrows_of_an_nsys_report(tmp_path: Path) -> None:
    """The shared 2xH100 nsys report: each rank's NVTX ranges (push/pop and start/end, counted in the SQLite by a
    second route) on its thread's host track; an arrow to each device event whose runtime call is recorded, from the
    innermost slice of its track at the call: the NVTX range the raw export gives by correlationId, runtime record
    and the ranges of its thread (tests/analyses/test_launches.py)."""
    report = TRACES / "nsys" / "nsysai_h100_2proc_nsys2026.2.sqlite"
    if not report.exists():
        pytest.skip(f"{report} is not here")
    db, out = tmp_path / "t.duckdb", tmp_path / "nsys.json"
    run_cli("ingest", report, "--db", db, "--run-id", "h100")
    said = run_cli("export", "h100", "--perfetto", out, "--db", db).stdout
    phases = check_structure(json.loads(out.read_text()))
    with sqlite3.connect(report) as raw:
        ranges = raw.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL"
                             ).fetchall()[0][0]
    nvtx = [x for x in phases["X"] if x["cat"] == "nvtx"]
    assert len(nvtx) == ranges == 16782 and {x["tid"] for x in nvtx} == {HOST_TRACK}
    names = {(m["pid"], m["args"]["name"].split(" · ")[0]) for m in phases["M"]
             if m["name"] == "thread_name" and m["tid"] == HOST_TRACK}
    assert names == {(0, "NVTX"), (1, "NVTX")}
    flows_s = {e["id"]: e for e in flows(phases, "s", "launch")}
    flows_f = {e["id"]: e for e in flows(phases, "f", "launch")}
    assert len(flows_s) == len(flows_f) == 2092 and "2092 kernels linked to their launching host range" in said
    first = store(db, "SELECT min(start_ns) FROM device_events")[0][0]
    shift = first - min(_ns(x["ts"]) for x in device_slices(phases))  # the store's clock (the raw one) - exported
    host = defaultdict(list)
    for x in nvtx:
        host[x["pid"]].append((_ns(x["ts"]) + shift, _ns(x["ts"]) + _ns(x["dur"]) + shift, x["args"]["thread"]))
    ends = {(x["pid"], _ns(x["ts"]) + shift): _ns(x["ts"]) + _ns(x["dur"]) + shift for x in device_slices(phases)}
    exported = Counter()
    for pid in (0, 1):
        pairs = [(_ns(flows_f[i]["ts"]) + shift, _ns(s["ts"]) + shift) for i, s in flows_s.items() if s["pid"] == pid]
        around = _innermost(host[pid], [t for _, t in pairs])
        exported.update((start, ends[pid, start], (around[t][2], *around[t][:2])) for start, t in pairs)
    assert exported == raw_nvtx_launchers(report)


def test_the_host_cap_keeps_the_shallowest_ranges(db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the cap a rank keeps its shallowest host ranges (whole top levels of each thread's tree, then the
    earliest of the next); the rest are counted, and a kernel whose op was left out has no arrow."""
    from traceana import store as traceana_store
    from traceana.render import perfetto, perfetto_host

    if not all(p.exists() for p in SAMPLED):
        pytest.skip(f"{SAMPLED[0]} is not here")
    monkeypatch.setattr(perfetto_host, "HOST_BUDGET", 0)
    monkeypatch.setattr(perfetto_host, "HOST_FLOOR", 500)
    with traceana_store.connect(db, read_only=True) as con:
        traceana_store.open_run(con, "sampled")
        done = perfetto.export(con, "sampled", tmp_path / "capped.json")
        levels = con.execute("SELECT rank, count(*), max(depth) FILTER (WHERE kept), "
                             "min(depth) FILTER (WHERE NOT kept) FROM x_host GROUP BY rank ORDER BY rank").fetchall()
        linked = con.execute("SELECT count(*) FROM event_launchers l JOIN x_events e USING (rank, event_id) "
                             "JOIN x_host h ON h.rank = l.rank AND h.op_id = l.op_id WHERE h.kept").fetchall()[0][0]
    phases = check_structure(json.loads((tmp_path / "capped.json").read_text()))
    host = [x for x in phases["X"] if x["tid"] >= HOST_TRACK]
    assert [r[0] for r in levels] == [0, 1] and done.host_cap == 500
    assert done.host_slices == len(host) == 2 * 500 and done.host_slices + done.host_capped == sum(r[1] for r in levels)
    assert all(deepest_kept <= shallowest_left for _, _, deepest_kept, shallowest_left in levels)
    assert 0 < done.launches == linked == len(flows(phases, "s", "launch")) < len(device_slices(phases))
