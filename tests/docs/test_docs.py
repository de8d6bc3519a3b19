"""The docs cannot drift: every example in docs/ is run on the samples and must print what the page shows, every
number a paragraph quotes must be printed by the examples it cites, and the store page's views are the
queries/*.sql headers. `python docs/gen.py` regenerates all of it (docs/contributing.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

spec = importlib.util.spec_from_file_location("docs_gen", ROOT / "docs" / "gen.py")
gen = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = gen  # dataclasses look their module up there
spec.loader.exec_module(gen)

pytestmark = pytest.mark.skipif(not gen.SHARED.is_dir(), reason="the docs' examples read ../shared/traces")


def test_every_page_shows_what_its_commands_print(tmp_path: Path) -> None:
    # one test, so that the store is built and the examples run once (also under pytest -n 2)
    rendered, outputs = gen.generate(tmp_path)
    stale = [str(p.relative_to(ROOT)) for p, text in rendered.items() if gen.normalised(p.read_text()) !=
             gen.normalised(text)]
    assert stale == [], "differs from what its commands print now: run `python docs/gen.py`"
    assert [problem for text in rendered.values() for problem in gen.check_quotes(text, outputs)] == []


def test_store_page_lists_every_view() -> None:
    store = (gen.DOCS / "store.md").read_text()
    views = sorted(p.stem.split("_", 1)[1] for p in (ROOT / "queries").glob("*.sql"))
    assert views and all(f"### `{v}`" in store for v in views)
    assert gen.views_markdown() in store


def test_a_quoted_number_the_output_lacks_is_caught() -> None:
    page = "Stage 0 waits 115.58 ms and 99.9% of it.\n<!-- quotes: a -->"
    printed = {"a": "$ x\nstage 0: 115.580 ms 12.0%"}  # 115.58 is there as a table prints it, 99.9% is not
    assert gen.check_quotes(page, printed) == ["'99.9%' (line 1) is not in the output of a"]
