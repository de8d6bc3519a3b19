"""Huawei Ascend profiler output (torch_npu, MindSpore, msprof). reader.py is the reader (``parse_rank`` per rank
folder, ``read`` per run: ranks, hosts, communicators); inputs.py finds each rank's files; database.py reads the
SQLite exports, timeline.py the trace_view / msprof JSON and kernels.py a text export without trace_view.json, all
into tasks.py's RankTrace; groups.py links HCCL ops to their communicators; memory.py reads the allocator's
samples."""
