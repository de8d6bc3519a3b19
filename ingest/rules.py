"""Name -> (category, op) classification from a data table that users can extend (ingest/rules.csv).

Rules are regular expressions searched in the event name, first match wins. A user's own file (``--rules``, same
columns) is consulted before the built-in table, so it can add DeepEP-like kernels or override a default.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import polars as pl

from traceana.errors import TraceanaError

CATEGORIES = ("compute", "comm", "memcpy", "memset", "sync", "other")


@dataclass(frozen=True)
class Rule:
    pattern: str
    category: str
    op: str | None


def _read(text: str, source: str) -> list[Rule]:
    rules = []
    rows = csv.DictReader(text.splitlines())
    for line, row in enumerate(rows, start=2):
        pattern, category = row.get("pattern"), row.get("category")
        if pattern is None or category is None:
            raise TraceanaError(f"{source}:{line}: needs the columns pattern,category,op")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise TraceanaError(f"{source}:{line}: bad pattern {pattern!r} ({exc})") from None
        if category not in CATEGORIES:
            raise TraceanaError(f"{source}:{line}: category {category!r} is not one of {', '.join(CATEGORIES)}")
        rules.append(Rule(pattern, category, row.get("op") or None))
    return rules


def load_rules(extra: Path | None = None) -> list[Rule]:
    """The user's rules (if any) followed by the built-in table."""
    builtin = _read(resources.files("traceana.ingest").joinpath("rules.csv").read_text(), "rules.csv")
    if extra is None:
        return builtin
    try:
        text = extra.read_text()
    except OSError as exc:
        raise TraceanaError(f"{extra}: cannot read rules file ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise TraceanaError(f"{extra}: not a text file (rules are CSV: pattern,category,op)") from None
    try:
        return _read(text, str(extra)) + builtin
    except csv.Error as exc:
        raise TraceanaError(f"{extra}: not readable as CSV ({exc})") from None


def classify(names: pl.Expr, rules: list[Rule]) -> list[pl.Expr]:
    """Expressions for ``category`` and ``rule_op`` (the op a rule fixes, else NULL) of each name."""
    category: pl.Expr = pl.lit("other")
    op: pl.Expr = pl.lit(None, dtype=pl.String())
    for rule in reversed(rules):  # build the chain inside out so the first rule is tested first
        hit = names.str.contains(rule.pattern)
        category = pl.when(hit).then(pl.lit(rule.category)).otherwise(category)
        op = pl.when(hit).then(pl.lit(rule.op, dtype=pl.String())).otherwise(op)
    return [category.alias("category"), op.alias("rule_op")]


def with_classes(frame: pl.DataFrame, names: str, rules: list[Rule]) -> pl.DataFrame:
    """``frame`` with the ``category`` and ``rule_op`` of its ``names`` column."""
    return per_name(frame, names, classify(pl.col(names), rules))


def per_name(frame: pl.DataFrame, names: str, columns: list[pl.Expr]) -> pl.DataFrame:
    """``frame`` with ``columns`` (expressions of its ``names`` column) computed once per distinct name and joined
    back in the frame's order: a run has a few hundred kernel names and millions of events, and the rules are a
    chain of regular expressions."""
    computed = frame.select(pl.col(names).unique()).with_columns(columns)
    return frame.join(computed, on=names, how="left", maintain_order="left", nulls_equal=True)
