"""Which traceana this is: the installed distribution's version, for `--version`, the store's runs, JSON and pages."""

from __future__ import annotations

from functools import cache


@cache
def version() -> str:
    """From the package metadata (pyproject.toml's version at install), read once when first asked for."""
    from importlib.metadata import version as installed

    return installed("traceana")
