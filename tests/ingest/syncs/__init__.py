"""The syncs table per format on the shared traces (mirrors ingest/syncs/)."""
