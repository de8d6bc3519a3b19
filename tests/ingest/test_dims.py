"""Dims of collectives on real traces that do not name their groups: stream, timing-match, fingerprint (issue 10).

Expected values come from a second route: the raw JSON read here with gzip/json (kernel streams, the CPU op that
launched each kernel, shapes, pg_config), and for the gloo samples the worker-thread -> group file the recording
wrote, which the ingester never reads (pg_config is removed from the copies it gets).
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import duckdb
import polars as pl
import pytest

from tests.conftest import SAMPLES, TRACES, query, run_cli
from tests.ingest.test_kineto import SAMPLE_LAYOUTS
from traceana.ingest.groups.communicators import _layout_groups
from traceana.ingest.groups.matching import _PREPARE_SQL, _pick, _prepare, _score, match_communicators
from traceana.layout import Layout

KINETO = TRACES / "kineto"

# A layout per shared trace, consistent with what the trace itself shows (it states only its rank and world size):
LAYOUTS = {
    "hta_rank0of2_pg_args": "dp=2",  # pg_config: one group, both ranks (default_pg), gradient all-reduces
    # reduce-scatter / all-gather shapes imply a group of 8 (65536 rows = 8 x 8192); stream 84 runs all-reduce and
    # all-to-all, so one group is both DP and EP: ep = dp = 2 (etp = tp = 8) gives EP and DP the same ranks
    "hta_rank0of16_a2a_rs_ag": "tp=8,dp=2,ep=2",
    "hta_rank3of8_6steps": "dp=8,ep=8",  # its one NCCL stream runs all-to-all and all-reduce: EP and DP share ranks
    # all-gather shapes imply a group of 64 (1073741824 = 64 x 16777216); all-reduce and all-to-all share a stream
    "hta_sampled_rank0of128": "tp=2,dp=64,ep=64",
    "hta_sampled_rank1of128": "tp=2,dp=64,ep=64",
    "hta_rank34of300_gloo_pgconfig": "dp=300",  # every pg_config group holds all 300 ranks
    "tracelens_b200_rank0of8_vllm": "tp=8",  # vLLM tensor parallel: pg_config groups are all 8 ranks or one
    "tracelens_mi300_rank0of8_rccl": "dp=8",  # pg_config: default_pg only, all 8 ranks
}
NO_COLLECTIVES = {"h200_gpt_h2048_L8_s1024_gb4", "h200_hostbound_h512_L12_s256_gb8"}  # one GPU each


def raw(name: str) -> dict:
    with gzip.open(KINETO / f"{name}.json.gz") as handle:
        return json.load(handle)


def comm_kernels(name: str) -> list[tuple[dict, str | None]]:
    """(NCCL kernel, name of the innermost nccl:* CPU op around its launch or None): the second route."""
    events = [e for e in raw(name)["traceEvents"] if e.get("ph") == "X"]
    runtime = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    hosts = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation") and e["name"].startswith("nccl:")]
    out = []
    for kernel in (e for e in events if e.get("cat") == "kernel" and e["name"].startswith("nccl")):
        call = runtime.get(kernel["args"].get("correlation"))
        around = [h for h in hosts if call and h["tid"] == call["tid"] and h["ts"] <= call["ts"] <= h["ts"] + h["dur"]]
        out.append((kernel, max(around, key=lambda h: h["ts"])["name"] if around else None))
    return out


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dims") / "t.duckdb"
    for file in sorted(KINETO.glob("*.json.gz")):
        run = file.name.removesuffix(".json.gz")
        run_cli("ingest", file, "--db", path, *(("--layout", LAYOUTS[run]) if run in LAYOUTS else ()))
    return path


def by_stream_op_dim(db: Path, run: str) -> Counter:
    rows = query(db, "SELECT d.stream, c.op, c.dim, c.evidence, count(*) FROM collectives c "
                     "JOIN device_events d USING (run_id, rank, event_id) WHERE run_id = ? GROUP BY ALL", run)
    return Counter({(s, op, dim, ev): n for s, op, dim, ev, n in rows})


def test_every_trace_with_collectives_has_95_percent_of_comm_time_in_a_dim(db: Path) -> None:
    with_comm = {r[0] for r in query(db, "SELECT DISTINCT run_id FROM collectives")}
    assert with_comm == set(LAYOUTS)
    assert {f.name.removesuffix(".json.gz") for f in KINETO.glob("*.json.gz")} == set(LAYOUTS) | NO_COLLECTIVES
    shares = dict(query(db, "SELECT c.run_id, sum(d.end_ns - d.start_ns) FILTER (WHERE c.dim <> 'UNKNOWN') "
                            "/ sum(d.end_ns - d.start_ns) FROM collectives c "
                            "JOIN device_events d USING (run_id, rank, event_id) GROUP BY c.run_id"))
    assert all(share >= 0.95 for share in shares.values()), shares


def test_pg_args_dims(db: Path) -> None:
    """hta_rank0of2: every NCCL kernel names its group in its args: [0, 1] under dp=2 is DP."""
    kernels = [k for k, _ in comm_kernels("hta_rank0of2_pg_args")]
    assert {k["args"]["Process Group Ranks"] for k in kernels} == {"[0, 1]"}
    ops = Counter({"allreduce": "AllReduce", "broadcast": "Broadcast"}[k["args"]["Collective name"]] for k in kernels)
    got = by_stream_op_dim(db, "hta_rank0of2_pg_args")
    assert got == Counter({(k["args"]["stream"], op, "DP", "pg-args"): n for k in kernels[:1] for op, n in ops.items()})


def test_b200_group_from_args_is_not_overridden(db: Path) -> None:
    kernels = [k for k, _ in comm_kernels("tracelens_b200_rank0of8_vllm")]
    assert [k["args"]["Process Group Ranks"] for k in kernels] == ["[0, 1, 2, 3, 4, 5, 6, 7]"]
    got = by_stream_op_dim(db, "tracelens_b200_rank0of8_vllm")
    assert got == Counter({(kernels[0]["args"]["stream"], "AllGather", "TP", "pg-args"): 1})


def test_stream_lends_its_group_to_kernels_without_args(db: Path) -> None:
    """mi300: 5 RCCL kernels lack args; they ran on the stream of default_pg's kernels, so they are its (DP)."""
    kernels = [k for k, _ in comm_kernels("tracelens_mi300_rank0of8_rccl")]
    bare = [k for k in kernels if "Collective name" not in k["args"]]
    assert len(bare) == 5 and {k["args"]["stream"] for k in kernels} == {4}
    got = by_stream_op_dim(db, "tracelens_mi300_rank0of8_rccl")
    assert {key: n for key, n in got.items() if key[3] == "stream"} == {(4, "Unknown", "DP", "stream"): 5}
    assert sum(got.values()) == len(kernels) and all(key[2] == "DP" for key in got)


def test_rank0of16_dims_by_stream_and_fingerprint(db: Path) -> None:
    """Stream 285 runs reduce-scatter / all-gather of a group of 8 (its shapes) -> TP; streams 84 and 363 run
    all-to-all -> EP, whose ranks [0, 8] are also DP's, so stream 84's all-reduces are DP."""
    events = [e for e in raw("hta_rank0of16_a2a_rs_ag")["traceEvents"] if e.get("ph") == "X"]
    for e in (e for e in events if e["name"] == "c10d::_reduce_scatter_base_"):
        out, full = (d[0] * d[1] for d in e["args"]["Input Dims"][:2])
        assert full == 8 * out
    op_of = {"nccl:all_to_all": "AllToAll", "nccl:_reduce_scatter_base": "ReduceScatter",
             "nccl:_all_gather_base": "AllGather", "nccl:all_reduce": "AllReduce", None: "SendRecv"}
    stream_dim = {285: "TP", 84: "EP", 363: "EP"}
    expected: Counter = Counter()
    for kernel, launcher in comm_kernels("hta_rank0of16_a2a_rs_ag"):
        stream, op = kernel["args"]["stream"], op_of[launcher]
        expected[(stream, op, "DP" if op == "AllReduce" else stream_dim[stream], "fingerprint")] += 1
    assert by_stream_op_dim(db, "hta_rank0of16_a2a_rs_ag") == expected
    groups = query(db, "SELECT dim, ranks, source, streams FROM process_groups "
                       "WHERE run_id = 'hta_rank0of16_a2a_rs_ag' ORDER BY dim")
    assert groups == [("EP", [0, 8], "fingerprint", "0:84 0:363"),
                      ("TP", list(range(8)), "fingerprint", "0:285")]


def test_rank3of8_equal_rank_sets_split_by_op(db: Path) -> None:
    kernels = comm_kernels("hta_rank3of8_6steps")
    launchers = Counter((k["args"]["stream"], launcher) for k, launcher in kernels)
    assert launchers == Counter({(21, "nccl:all_to_all"): 42, (21, "nccl:all_reduce"): 18})
    assert by_stream_op_dim(db, "hta_rank3of8_6steps") == Counter(
        {(21, "AllToAll", "EP", "fingerprint"): 42, (21, "AllReduce", "DP", "fingerprint"): 18})


def test_unknown_dims_are_said_once(tmp_path: Path) -> None:
    """Without a layout nothing can name hta_rank0of16's groups: one note with the count, share and remedies."""
    out = run_cli("ingest", KINETO / "hta_rank0of16_a2a_rs_ag.json.gz", "--db", tmp_path / "t.duckdb").stdout
    notes = [line for line in out.splitlines() if "have no dim" in line]
    assert notes == ["  note: 80 of 80 collectives (100% of communication time) have no dim: pass --layout; "
                     "or ingest all 16 ranks (this run has 1); or record with a PyTorch that writes pg_config and "
                     "Process Group args (2.2 or newer): this trace states no process groups"]


def test_a_trace_with_pg_config_is_not_told_to_record_one(tmp_path: Path) -> None:
    """hta_rank0of2 states its group (pg_config): what is missing is the other rank, or a layout."""
    trace = KINETO / "hta_rank0of2_pg_args.json.gz"
    with gzip.open(trace) as handle:
        assert json.load(handle)["distributedInfo"]["pg_config"]
    out = run_cli("ingest", trace, "--db", tmp_path / "t.duckdb").stdout
    notes = [line for line in out.splitlines() if "have no dim" in line]
    assert notes == ["  note: 21 of 21 collectives (100% of communication time) have no dim: pass --layout; "
                     "or ingest all 2 ranks (this run has 1)"]


# Timing cannot tell these apart: in pp2_mb1 each worker thread runs one 2 MiB all-reduce, and all four ranks run
# theirs at once, so the PP pairs overlap exactly like the true DP pairs (4 of 8 go to PP), and both pairings give
# every group members that run the same collectives. With pg_config, torch's group creation order settles it
# (test_kineto); without it the layout's groups carry no order. (moe_skewed, where 2 of 40 expert-data-parallel
# all-reduces overlap an expert-parallel one of the same size, was here until members had to agree: issue 35.)
AMBIGUOUS = {"pp2_mb1"}


@pytest.mark.parametrize("experiment", [
    pytest.param(e, marks=pytest.mark.xfail(strict=True, reason="simultaneous same-size collectives"))
    if e in AMBIGUOUS else e for e in sorted(SAMPLE_LAYOUTS)])
def test_gloo_groups_recovered_without_pg_config(tmp_path: Path, experiment: str) -> None:
    """The gloo samples (toy8: 8 ranks, the others 4) with pg_config removed: groups are recovered by matching
    against the layout's groups alone. Ground truth: the recorded worker thread -> group file and the original
    pg_config's ranks, neither of which the ingester sees."""
    truth = json.loads((SAMPLES / f"{experiment}.pg_threads.json").read_text())
    layout = Layout.parse(SAMPLE_LAYOUTS[experiment])
    members: dict[int, dict[str, tuple[list[int], str]]] = {}
    for file in sorted((SAMPLES / experiment).glob("rank*.json.gz")):
        trace = json.loads(gzip.decompress(file.read_bytes()))
        info = trace["distributedInfo"]
        members[info["rank"]] = {pg["pg_name"]: (pg["ranks"], pg["pg_desc"]) for pg in info.pop("pg_config")}
        (tmp_path / file.name).write_bytes(gzip.compress(json.dumps(trace).encode(), 1))
    db = tmp_path / "t.duckdb"
    run_cli("ingest", tmp_path, "--layout", SAMPLE_LAYOUTS[experiment], "--db", db)
    rows = query(db, "SELECT c.rank, d.stream, c.op, c.dim, c.evidence, g.ranks, c.peer FROM collectives c "
                     "JOIN device_events d USING (run_id, rank, event_id) "
                     "LEFT JOIN process_groups g ON g.run_id = c.run_id AND g.pg = c.pg")
    collectives = [r for r in rows if r[2] not in ("Send", "Recv")]
    assert collectives
    for rank, stream, _op, dim, evidence, ranks, _peer in collectives:
        true_ranks, desc = members[rank][truth[str(rank)][str(stream)]]
        assert (ranks, dim, evidence) == (true_ranks, layout.dim_of(true_ranks, desc)[0], "timing-match")
    for rank, _stream, _op, dim, evidence, ranks, peer in (r for r in rows if r[2] in ("Send", "Recv")):
        assert dim == "PP" and evidence == "fingerprint" and rank in ranks and peer in ranks and peer != rank


def test_info_reads_a_store_written_before_process_groups_had_streams(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    run_cli("ingest", KINETO / "hta_rank0of2_pg_args.json.gz", "--layout", "dp=2", "--db", db)
    with duckdb.connect(str(db)) as con:
        con.execute("ALTER TABLE process_groups DROP COLUMN streams")
    info = json.loads(run_cli("info", "--db", db, "--json").stdout)
    assert info["process_groups"] == [{"pg": "0", "dim": "DP", "name": "default_pg", "ranks": [0, 1],
                                       "source": "trace"}]


def test_two_ranks_of_a_larger_job_are_not_matched_to_a_group_of_their_own(tmp_path: Path) -> None:
    """hta_sampled ranks 0 and 1 of 128 run the same collectives at the same time; with 126 ranks missing, timing
    would pair them as a group of two (TP [0, 1]). They are fingerprinted instead: the all-gather's shapes say 64
    ranks (DP under tp=2,dp=64,ep=64, whose DP and EP share ranks), all-to-all on the all-reduce stream says EP."""
    names = ("hta_sampled_rank0of128", "hta_sampled_rank1of128")
    for name in names:
        gathers = [e for e in raw(name)["traceEvents"] if e.get("name") == "c10d::_allgather_base_"]
        assert gathers and all(d[0][0] == 64 * d[1][0] for d in (e["args"]["Input Dims"] for e in gathers))
    db = tmp_path / "t.duckdb"
    run_cli("ingest", *(KINETO / f"{n}.json.gz" for n in names), "--layout", LAYOUTS[names[0]], "--db", db)
    got = Counter({(r, op, dim, ev): n for r, op, dim, ev, n in query(
        db, "SELECT rank, op, dim, evidence, count(*) FROM collectives GROUP BY ALL")})
    expected: Counter = Counter()
    op_of = {"nccl:all_to_all": ("AllToAll", "EP"), "nccl:all_reduce": ("AllReduce", "DP"),
             "nccl:_all_gather_base": ("AllGather", "DP")}
    for rank, name in enumerate(names):
        for _kernel, launcher in comm_kernels(name):
            expected[(rank, *op_of[launcher], "fingerprint")] += 1
    assert got == expected
    assert query(db, "SELECT pg, ranks[:3] FROM process_groups ORDER BY pg") == [("EP:0", [0, 2, 4]),
                                                                                 ("EP:1", [1, 3, 5])]


@pytest.mark.parametrize("export", sorted((TRACES / "nsys").glob("*.sqlite")), ids=lambda p: p.stem)
def test_shared_nsys_exports_hold_no_collectives(export: Path) -> None:
    """The >= 95% rule has nothing to measure on the shared nsys exports: none ran an NCCL kernel (raw SQLite)."""
    import sqlite3

    from traceana.ingest.dispatch import IngestOptions, read_run

    with sqlite3.connect(f"file:{export}?mode=ro", uri=True) as con:
        nccl = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                           "ON s.id = k.shortName WHERE s.value LIKE '%nccl%'").fetchone()[0]
    assert nccl == 0
    data = read_run([export], "auto", IngestOptions(cache_dir=Path("/nonexistent")))
    assert data.table("collectives").is_empty()


def _tied_all_reduces() -> pl.DataFrame:
    """Four ranks of TP2·DP2 (TP [0, 1] [2, 3] are torch's groups "1" "2", DP [0, 2] [1, 3] "3" "4"), each with four
    gloo worker threads in creation order: TP forward, TP backward, DP weight 1, DP weight 2; two steps of four 1 MiB
    all-reduces that every rank starts at once. The TP backward's ends lie r1 - r0 - r2 - r3 (9.0, 10.0, 10.4,
    11.4 ms): ranks 0 and 2 end closer to each other than to their TP peer, ranks 1 and 3 closer to their own."""
    ends = {"fwd": (5.0, 5.1, 7.0, 7.1), "bwd": (10.0, 9.0, 10.4, 11.4), "w1": (5.0, 7.0, 5.1, 7.1),
            "w2": (5.0, 7.0, 5.1, 7.1)}  # ms after the start, ranks 0..3
    rows = [(rank, 100 * rank + k, 4 * step + k, "AllReduce", 1 << 20, start, start + int(ms[rank] * 1e6))
            for rank in range(4) for step in range(2) for k, ms in enumerate(ends.values())
            for start in [step * 100_000_000 + k * 20_000_000]]
    return pl.DataFrame(rows, orient="row", schema={
        "rank": pl.Int32(), "stream": pl.Int64(), "event_id": pl.Int64(), "op": pl.String(), "bytes": pl.Int64(),
        "start_ns": pl.Int64(), "end_ns": pl.Int64()})


def test_groups_that_tie_on_size_and_time_go_by_their_members() -> None:
    """Issue 35 item 7. Timing matches every thread to its TP group and its DP group alike (same op, same size, same
    moment), and end times alone sent rank 0's and rank 2's TP backward thread to DP [0, 2]: one TP all-reduce a
    step counted as DP on ranks 0 and 2. Then TP [0, 1] runs 2 collectives on rank 0 and 4 on rank 1, which no
    group's instances can do: members of a group run the same collectives, so each thread keeps its own group."""
    groups = pl.DataFrame({"pg": ["0", "1", "2", "3", "4"], "ranks": [[0, 1, 2, 3], [0, 1], [2, 3], [0, 2], [1, 3]]},
                          schema={"pg": pl.String(), "ranks": pl.List(pl.Int32())})
    got = {(r, s): pg for r, s, pg in match_communicators(_tied_all_reduces(), groups).iter_rows()}
    truth = {0: ("1", "1", "3", "3"), 1: ("1", "1", "4", "4"), 2: ("2", "2", "3", "3"), 3: ("2", "2", "4", "4")}
    assert got == {(rank, 100 * rank + k): pg for rank, pgs in truth.items() for k, pg in enumerate(pgs)}


@pytest.mark.parametrize("experiment", ["toy8_tp2pp2dp2_1f1b", "moe_skewed"])
def test_clean_bursts_score_as_their_pairwise_partners_do(tmp_path: Path, experiment: str) -> None:
    """Matching counts the partners of a clean burst's ops (one op per rank, all overlapping) per group with window
    functions, and lists the other bursts' partners pair by pair (matching._PREPARE_SQL). On a real gloo sample's
    collectives, which hold both kinds, listing every burst's partners pair by pair gives the same scores: in the
    first pass and given an assignment."""
    db = tmp_path / "t.duckdb"
    run_cli("ingest", SAMPLES / experiment, "--db", db)
    ops = pl.DataFrame(query(db, "SELECT c.rank, d.stream, c.event_id, c.op, c.bytes, d.start_ns, d.end_ns "
                                 "FROM collectives c JOIN device_events d USING (run_id, rank, event_id) "
                                 "WHERE c.op NOT IN ('Send', 'Recv')"), orient="row",
                       schema=["rank", "stream", "event_id", "op", "bytes", "start_ns", "end_ns"])
    world = ops["rank"].n_unique()
    candidates = _layout_groups(Layout.parse(SAMPLE_LAYOUTS[experiment]), world)

    def scores(pairwise: bool) -> tuple[pl.DataFrame, pl.DataFrame, int]:
        with duckdb.connect() as con:
            _prepare(con, ops, candidates)
            clean = con.sql("SELECT count(*) FROM bursts WHERE clean").fetchall()[0][0]
            if pairwise:
                con.execute("UPDATE bursts SET clean = false; DROP TABLE clean; DROP TABLE partners")
                for sql in _PREPARE_SQL[2:]:
                    con.execute(sql)
            first = _score(con, None)
            return first, _score(con, _pick(first)), clean

    fast, slow = scores(False), scores(True)
    assert 0 < fast[2] < ops.height and slow[2] == fast[2]  # both kinds of bursts are there
    assert fast[0].height > 0 and fast[0].equals(slow[0]) and fast[1].equals(slow[1])
