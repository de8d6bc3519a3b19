"""PyTorch profiler (Kineto) Chrome-trace JSON, one file per rank. reader.py is the reader: ``parse_file`` does one
file's work (in a worker), ``read`` the run's (ranks, host clocks, process groups). events.py parses a file into
DuckDB's ``ev`` table; link.py links its kernels to their launches and CPU ops and finds its device step windows;
cpu.py reads CPU-only (gloo) runs, where the process is the device."""
