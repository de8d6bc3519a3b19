"""Cut TraceLens's rocprofv3 sample (tests/rocprof/908_results.json.gz, 1.7 MB) to a test-sized file, reproducibly.

    python tests/data/traces/cut_rocprofv3.py 908_results.json.gz tests/data/traces/rocprofv3_mi350x_908.json.gz

Keeps every record of the one process as rocprofv3 wrote it (all 43,915 kernel dispatches), except that
``kernel_symbols`` keeps only the 80 symbols the dispatches name (of 9,889 loaded: 18 of the 21 MB). Nothing is edited.
"""

import gzip
import json
import sys

source, target = sys.argv[1:3]
with gzip.open(source) as handle:
    doc = json.load(handle)
process = doc["rocprofiler-sdk-tool"][0]
used = {d["dispatch_info"]["kernel_id"] for d in process["buffer_records"]["kernel_dispatch"]}
process["kernel_symbols"] = [s for s in process["kernel_symbols"] if s.get("kernel_id") in used]
with gzip.open(target, "wt", compresslevel=9) as handle:
    json.dump(doc, handle, separators=(",", ":"))
