"""Tool results small enough for a model's context: every list cut to ``top`` rows with a note saying so, floats to
4 significant figures (NaN and infinities as null), one line of compact JSON."""

from __future__ import annotations

import json
import math
from typing import Any

import polars as pl

SIG_FIGS = 4


class Result:
    """One tool's answer under construction: fields in order, and the notes of what was cut or left out."""

    def __init__(self, **fields: Any) -> None:
        self.fields: dict[str, Any] = dict(fields)
        self.notes: list[str] = []

    def rows(self, name: str, frame: pl.DataFrame, top: int, keep: str | None = None, magnitude: bool = False) -> None:
        """``frame``'s first ``top`` rows as records under ``name`` (``keep``: the ``top`` with the largest value of
        that column, or of its absolute value with ``magnitude``, still in the frame's order), with a note when rows
        were cut."""
        if frame.height > top:
            which = "the first" if keep is None else f"the largest {f'|{keep}|' if magnitude else keep}"
            self.notes.append(f"{name}: {top} of {frame.height} rows shown, {which} (pass a larger top)")
            if keep is not None:
                order = (pl.col(keep).abs() if magnitude else pl.col(keep)).fill_nan(None)  # NaN sorts largest
                frame = frame.with_row_index("_order").sort(order, descending=True, nulls_last=True).head(top)
                frame = frame.sort("_order").drop("_order")
        self.fields[name] = _records(frame.head(top))

    def to_json(self) -> str:
        """Compact JSON: the fields, then the notes (when there are any)."""
        notes = [*self.fields.get("notes", []), *self.notes]
        payload = {**self.fields, **({"notes": notes} if notes else {})}
        return json.dumps(_rounded(payload), separators=(",", ":"), default=str, allow_nan=False)


def _records(frame: pl.DataFrame) -> list[dict[str, Any]]:
    floats = [c for c, t in frame.schema.items() if t.is_float()]
    return frame.with_columns(pl.col(floats).round_sig_figs(SIG_FIGS).fill_nan(None)).to_dicts()


def _rounded(value: Any) -> Any:
    """``value`` with every float at SIG_FIGS significant figures and non-finite floats as None (JSON has no NaN)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return float(f"{value:.{SIG_FIGS}g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value
