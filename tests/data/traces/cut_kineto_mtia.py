"""Cut HTA's MTIA trace (tests/data/mtia_trace_single_rank/mtia_rank_0.json.gz, 3.0 MB) to a test-sized file.

    python tests/data/traces/cut_kineto_mtia.py mtia_rank_0.json.gz tests/data/traces/hta_mtia_rank_0_no_cpu_ops.json.gz

Drops the 108,889 ``cpu_op`` events (host operators: no device work, no step marker, no collective launcher in
this trace) and the repeated copies of identical metadata events (``process_name`` etc. written 62,111 times for the
same 5 processes); every other event, and the envelope (distributedInfo with its one-rank pg_config,
deviceProperties, baseTimeNanoseconds), is kept as written. The device breakdown is the same as the full file's.
"""

import gzip
import json
import sys

source, target = sys.argv[1:3]
with gzip.open(source) as handle:
    doc = json.load(handle)
seen: set[str] = set()
kept = []
for event in doc["traceEvents"]:
    if event.get("cat") == "cpu_op":
        continue
    if event.get("ph") == "M":
        key = json.dumps(event, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
    kept.append(event)
doc["traceEvents"] = kept
with gzip.open(target, "wt", compresslevel=9) as handle:
    json.dump(doc, handle, separators=(",", ":"))
