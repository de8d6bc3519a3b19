"""Nsight Systems: SQLite exports and .nsys-rep reports. reader.py is the reader (``parse_report`` per report, ``read``
per run: ranks, session clocks); report.py reads one report's kernels, copies, NVTX ranges and stated ranks into
frames; export.py opens one export across nsys versions and exports a .nsys-rep with the nsys CLI; comm.py says
what each NCCL kernel did (op, dtype, evidence) from its name and the ranges around its launch."""
