"""How an ingest scales past one process and one memory: per-file work in worker processes or Ray tasks
(``executor.py``), and each file's per-event tables spilled to Parquet beside the store and streamed in
(``spill.py``), so that a run is never held in memory whole."""
