"""The documentation: docs/ shows what the commands print on the samples."""
