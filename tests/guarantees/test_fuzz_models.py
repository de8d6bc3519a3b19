"""Property-based fuzzing of the model commands and the HTML pages: `whatif`, `predict`, `advise`, `calibrate`,
`report --html` and `diff --html`, given hostile arguments (change specs, steps, run ids, output paths), damaged
job configs (keys missing, values of the wrong type, NaN, infinite, negative, huge; truncated or not UTF-8) and
damaged stores (a real store with rows deleted or values changed as a sloppy writer would). Whatever happens, the
promise of docs/errors.md holds: exit 0, or exit 2 with one `error:` line; never a traceback or an internal error,
and the store folder byte for byte as it was (the commands only read it).

The store is the sample pair pp2_mb1 / pp2_mb8 (real gloo CPU runs, with their layout), made once per module; each
case runs in this process. CI runs a few derandomized examples per property; a longer, random run:
    TRACEANA_FUZZ_EXAMPLES=100 TRACEANA_FUZZ_LOG=/tmp/fuzz-models.jsonl .venv/bin/pytest -q \
        tests/guarantees/test_fuzz_models.py
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import duckdb
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import SAMPLES, run_main

EXAMPLES = int(os.environ.get("TRACEANA_FUZZ_EXAMPLES", "6"))
LOG = os.environ.get("TRACEANA_FUZZ_LOG")
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize="TRACEANA_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=list(HealthCheck))

CONFIGS = SAMPLES.parent / "configs"
RUN, OTHER = "pp2_mb1", "pp2_mb8"
LAYOUT = "pp=2,dp=2,order=tp-cp-ep-pp-dp"
ODD = [None, float("nan"), float("inf"), -float("inf"), -1, 0, 1e300, 2**70, -(10**15), 0.5, "abc", "", "四", [],
       {}, [1, "x"], True, {"a": 1}]


def _paths(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        out.append(f"{prefix}{key}")
        if isinstance(value, dict):
            out += _paths(value, f"{prefix}{key}.")
    return out


BASE = yaml.safe_load((CONFIGS / f"{RUN}.yaml").read_text())
KEYS = [*_paths(BASE), "model.moe_experts", "parallel.vpp", "hardware.profile", "schedule.interleave", "nonsense"]


def fingerprint(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pp2_mb1 and pp2_mb8, ingested with their layout."""
    db = tmp_path_factory.mktemp("fuzz-models") / "s.duckdb"
    for run in (RUN, OTHER):
        code, _, err = run_main("ingest", SAMPLES / run, "--layout", LAYOUT, "--db", db)
        assert code == 0, err
    return db


def promise(args: list, folder: Path, case: object) -> tuple[int, str]:
    """Run ``args`` and hold the promise over ``folder`` (the store's)."""
    before = fingerprint(folder)
    code, out, err = run_main(*args)
    lines = err.strip().splitlines()
    changed = fingerprint(folder) != before
    if LOG:
        with open(LOG, "a") as log:
            log.write(json.dumps({"args": [str(a)[:120] for a in args], "case": repr(case)[:300], "code": code,
                                  "message": lines[0][:300] if lines else "", "store_changed": changed,
                                  "traceback": "Traceback" in err}) + "\n")
    assert "Traceback" not in err and code in (0, 2), (case, args, err[-2000:])
    if code:
        assert len(lines) == 1 and lines[0].startswith("error: ") and "internal error" not in lines[0], (case, err)
    else:
        assert "Warning" not in err, (case, err)  # numpy's "invalid value encountered" was a NaN carried on
    assert not changed, (case, args, "the store changed")
    return code, out


def _set(tree: dict, path: str, value: object, delete: bool) -> None:
    *parents, last = path.split(".")
    for key in parents:
        if not isinstance(tree.get(key), dict):
            if delete:
                return
            tree[key] = {}
        tree = tree[key]
    if delete:
        tree.pop(last, None)
    else:
        tree[last] = value


config_damage = st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(ODD), st.booleans()), min_size=1,
                         max_size=3)
raw_damage = st.one_of(st.none(), st.none(), st.tuples(st.sampled_from(["truncate", "non-utf8"]), st.floats(0, 0.99)))


def damaged_config(folder: Path, changes: list, raw: tuple | None) -> Path:
    tree = json.loads(json.dumps(BASE))
    for key, value, delete in changes:
        _set(tree, key, value, delete)
    data = yaml.safe_dump(tree, allow_unicode=True).encode()
    if raw:
        cut = int(len(data) * raw[1])
        data = data[:cut] if raw[0] == "truncate" else data[:cut] + b"\xff\xfe\xc3(" + data[cut:]
    path = folder / "job.yaml"
    path.write_bytes(data)
    return path


@FUZZ
@given(changes=config_damage, raw=raw_damage,
       command=st.sampled_from(["predict-config", "predict-to", "predict-set", "advise", "calibrate", "report"]))
def test_a_damaged_config_is_used_or_one_line(store, tmp_path_factory, changes, raw, command) -> None:
    tmp = tmp_path_factory.mktemp("case")
    cfg = damaged_config(tmp, changes, raw)
    good, target = CONFIGS / f"{RUN}.yaml", CONFIGS / f"{OTHER}.yaml"
    key, value, _ = changes[0]
    args = {"predict-config": ["predict", RUN, "--config", cfg, "--to", target],
            "predict-to": ["predict", RUN, "--config", good, "--to", cfg],
            "predict-set": ["predict", RUN, "--config", good, "--set", f"{key}={json.dumps(value)}"],
            "advise": ["advise", RUN, "--config", cfg],
            "calibrate": ["calibrate", RUN, "--config", cfg, "--write", tmp / "profile.yaml"],
            "report": ["report", RUN, "--html", tmp / "r.html", "--estimate", cfg]}[command]
    promise([*args, "--db", store], store.parent, (command, changes, raw))


CHANGE_KEYS = ["dim", "dim", "op", "pg", "kernel", "host", "rank", "rank", "stage", "overlap", "", "DIM", "nonsense"]
TARGETS = ["PP", "DP", "DP", "TP", "AllReduce", "Send", "*", "0", "1", "1", "3", "-1", str(2**40), "", "*gemm*", "[",
           "四", "a,b", "PP:0"]
FACTORS = ["", ":0.5", ":0.5", ":median", ":0", ":-1", ":nan", ":inf", ":1e308", ":abc", ":", "::", ":1.4", ":-0.0",
           ":1e-300"]
STEPS = [None, "0", "1", "2", "-1", "median", "all", "abc", "99999", str(2**63), "1.5", ""]


@FUZZ
@given(changes=st.lists(st.tuples(st.sampled_from(CHANGE_KEYS), st.sampled_from(TARGETS), st.sampled_from(FACTORS)),
                        min_size=1, max_size=3),
       step=st.one_of(st.none(), st.none(), st.sampled_from(STEPS)), run=st.sampled_from([RUN, RUN, RUN, "nope"]),
       json_out=st.booleans())
def test_hostile_whatif_and_advise_arguments_are_answered_or_one_line(store, changes, step, run, json_out) -> None:
    specs = [f"{k}={t}{f}" if k else f"{t}{f}" for k, t, f in changes]
    extra = [*(["--step", step] if step is not None else []), *(["--json"] if json_out else [])]
    promise(["whatif", run, *[a for s in specs for a in ("--change", s)], *extra, "--db", store], store.parent,
            ("whatif", specs, step, run))
    promise(["advise", run, *extra, "--db", store], store.parent, ("advise", step, run))


# Damage to a real store, as a sloppy writer or a half-finished manual edit would leave it.
STORE_DAMAGE = {
    "no steps": "DELETE FROM steps",
    "no collectives": "DELETE FROM collectives",
    "no process groups": "DELETE FROM process_groups",
    "one rank's events": "DELETE FROM device_events WHERE rank = 1",
    "a rank gone": "DELETE FROM ranks WHERE rank = 3",
    "no events": "DELETE FROM device_events",
    "dims unknown": "UPDATE collectives SET dim = 'UNKNOWN'",
    "bytes unknown": "UPDATE collectives SET bytes = NULL",
    "zero-length events": "UPDATE device_events SET end_ns = start_ns",
    "huge times": f"UPDATE device_events SET end_ns = {2**62} WHERE event_id % 7 = 0",
    "sentinel launches": f"UPDATE device_events SET launch_ns = {-(2**63 - 1)} WHERE event_id % 5 = 0",
    "layout gone": "UPDATE ranks SET tp = NULL, pp = NULL, dp = NULL",
    "one step": "DELETE FROM steps WHERE step > (SELECT min(step) FROM steps)",
    "world size 0": "UPDATE runs SET world_size = 0",
}


@pytest.fixture(scope="module")
def damaged_stores(store, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, sql in STORE_DAMAGE.items():
        db = tmp_path_factory.mktemp("damaged") / "s.duckdb"
        shutil.copy(store, db)
        with duckdb.connect(str(db)) as con:
            con.execute(sql)
            con.execute("CHECKPOINT")
        out[name] = db
    return out


MODEL_COMMANDS = {
    "whatif": ["whatif", RUN, "--change", "dim=DP:0.5", "--change", "rank=1:median"],
    "predict": ["predict", RUN, "--config", CONFIGS / f"{RUN}.yaml", "--to", CONFIGS / f"{OTHER}.yaml"],
    "advise": ["advise", RUN, "--config", CONFIGS / f"{RUN}.yaml"],
    "calibrate": ["calibrate", RUN, "--config", CONFIGS / f"{RUN}.yaml"],
    "replay": ["replay", RUN],
    "idle": ["idle", RUN], "breakdown": ["breakdown", RUN],
}


@FUZZ
@given(damage=st.sampled_from(sorted(STORE_DAMAGE)),
       command=st.sampled_from([*MODEL_COMMANDS, "report", "diff-html"]))
def test_a_damaged_store_is_read_or_one_line(damaged_stores, tmp_path_factory, damage, command) -> None:
    db = damaged_stores[damage]
    out = tmp_path_factory.mktemp("pages")
    args = MODEL_COMMANDS.get(command) or (["report", RUN, "--html", out / "r.html"] if command == "report" else
                                           ["diff", OTHER, RUN, "--html", out / "d.html"])
    code, _ = promise([*args, "--db", db], db.parent, (damage, command))
    if code == 0 and command in ("report", "diff-html"):
        assert next(out.iterdir()).read_text().lstrip().lower().startswith("<!doctype html")


@pytest.mark.parametrize(("damage", "command"), [
    ("no process groups", "advise"), ("no process groups", "report"), ("no events", "report"),
    ("zero-length events", "report"), ("zero-length events", "whatif"), ("huge times", "diff-html"),
    ("sentinel launches", "replay"), ("sentinel launches", "advise")])
def test_the_damaged_stores_the_fuzz_found(damaged_stores, tmp_path_factory, damage, command) -> None:
    """Each was an internal error (or a numpy warning) before: a slow group the store names no pg of, a report of
    a run without compute, a rank-to-median change where a rank has no compute, a sum past int64, a -2^63 launch
    (the replay graph's int64 arithmetic overflowed)."""
    test_a_damaged_store_is_read_or_one_line.hypothesis.inner_test(damaged_stores, tmp_path_factory, damage, command)


@pytest.mark.parametrize("where", ["missing-folder", "a-folder", "no-suffix", "pdf", "into-the-store"])
@pytest.mark.parametrize("command", ["report", "diff"])
def test_a_page_written_where_it_cannot_be_is_one_line(store, tmp_path, where, command) -> None:
    target = {"missing-folder": tmp_path / "nope" / "r.html", "a-folder": tmp_path, "no-suffix": tmp_path / "r",
              "pdf": tmp_path / "r.pdf", "into-the-store": store}[where]
    args = ["report", RUN, "--html", target] if command == "report" else ["diff", OTHER, RUN, "--html", target]
    promise([*args, "--db", store], store.parent, (command, where))
