"""Regenerate every example output in docs/ by running its commands on the samples, and the store page's view columns
from the headers of queries/*.sql, so that no quoted output or column can drift from what the code does.

    .venv/bin/python docs/gen.py            # rewrite the pages in place
    .venv/bin/python docs/gen.py --check    # exit 1 naming each page that differs (what tests/docs/test_docs.py does)

Conventions (docs/contributing.md says them for page authors):
- ``<!-- example: ID -->`` (optionally ``exit=N``) on the line before a ```` ```console ```` fence: each ``$ `` line in
  the fence is a command, run in one working folder shared by every page (the samples, examples/ and ../shared
  linked in, and the store of SETUP built once), its output (stdout and stderr, 100 columns) written below it. A
  plain ``traceana ARGS`` line runs through the CLI's entry point in this process (an interpreter start and the
  imports per command were half the docs' time), any other line with bash. Pages run in file-name order, blocks in
  page order.
- ``<!-- quotes: ID [ID...] -->`` on the line after a paragraph: every number in the paragraph must appear in the
  output (or the commands) of those examples.
- ``<!-- views -->`` ... ``<!-- /views -->``: replaced by each view's header comment from queries/*.sql.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shlex
import subprocess
import sys
import tempfile
from contextlib import chdir, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SHARED = ROOT.parent / "shared"

# The store every example reads unless it names another: the samples' runs (the layouts sample_traces/README.md
# gives), and two shared GPU traces. An example that quotes one of these commands gets this output without a rerun.
SETUP = [
    "traceana ingest sample_traces/traces/pp2_mb1 --layout pp=2,dp=2,order=tp-cp-ep-pp-dp",
    "traceana ingest sample_traces/traces/pp2_mb8 --layout pp=2,dp=2,order=tp-cp-ep-pp-dp",
    "traceana ingest sample_traces/traces/moe_skewed --layout ep=2,dp=4",
    "traceana ingest ../shared/traces/kineto/hta_rank3of8_6steps.json.gz",
    "traceana ingest ../shared/traces/kineto/h200_gpt_h2048_L8_s1024_gb4.json.gz --run-id gpt",
    # the latest run: commands without RUN take it
    "traceana ingest sample_traces/traces/toy8_tp2pp2dp2_1f1b --layout tp=2,pp=2,dp=2",
]

EXAMPLE = re.compile(r"<!-- example: (?P<id>[\w-]+)(?: exit=(?P<exit>\d+))? -->")
QUOTES = re.compile(r"<!-- quotes: (?P<ids>[\w -]+?) -->")
NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?%?")
# What truly varies between two runs of one command (the working folder is replaced as it is printed): when a run
# was ingested, and how long a command took ("3.9 MB in 0.3 s", "55 simulated, 0.5 s").
WIDTH = 100  # the columns every example is printed at
SHELL = "|&;<>()$`\\*?[]#~{}\n"  # a command holding one of these runs in bash (quotes shlex reads as bash does)
VARIES = [(re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?"), "<time>"),
          (re.compile(r"(?<=[ (])\d+(?:\.\d+)? s\b"), "<seconds>")]


@dataclass
class Session:
    """One working folder for every example: the store is built once, commands run in order."""

    work: Path
    outputs: dict[str, str] = field(default_factory=dict)  # example id -> its commands and outputs, as written
    cache: dict[str, str] = field(default_factory=dict)    # SETUP command -> its output

    @classmethod
    def start(cls, base: Path) -> Session:
        repo = base / "traceana"
        repo.mkdir(parents=True)
        for name in ("sample_traces", "examples"):
            (repo / name).symlink_to(ROOT / name)
        (base / "shared").symlink_to(SHARED)
        session = cls(repo)
        for command in SETUP:
            session.cache[command] = session.run(command, 0)
        return session

    def run(self, command: str, expect: int) -> str:
        if command in self.cache:
            return self.cache[command]
        argv = [] if set(command) & set(SHELL) else shlex.split(command)  # split only what bash would not read
        if argv[:1] == ["traceana"]:
            code, text = self.run_in_process(argv[1:])
        else:
            env = {**os.environ, "COLUMNS": str(WIDTH), "PYTHONUNBUFFERED": "1", "TERM": "dumb",
                   "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
            done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=self.work, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
            code, text = done.returncode, done.stdout
        if code != expect:
            raise RuntimeError(f"`{command}` exited {code}, the docs say {expect}:\n{text}")
        for path, shown in ((self.work, "."), (SHARED.resolve(), "../shared"), (ROOT, ".")):
            text = text.replace(str(path), shown)
        return "\n".join(line.rstrip() for line in text.rstrip().splitlines())

    def run_in_process(self, args: list[str]) -> tuple[int, str]:
        """`traceana ARGS` through its entry point, in the working folder: (exit code, stdout and stderr as written,
        interleaved), the tables WIDTH columns wide as a pipe with COLUMNS=WIDTH prints them."""
        from traceana.cli.main import main
        from traceana.render import console

        out, width = io.StringIO(), console.console.width
        console.console.width = WIDTH
        try:
            with chdir(self.work), redirect_stdout(out), redirect_stderr(out):
                main(args)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        finally:
            console.console.width = width
        return code, out.getvalue()


def render_page(text: str, session: Session) -> str:
    """The page with each example block's output regenerated and its views section rebuilt."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        out.append(lines[i])
        marker = EXAMPLE.fullmatch(lines[i].strip())
        i += 1
        if not marker:
            continue
        if i >= len(lines) or lines[i].strip() != "```console":
            raise ValueError(f"{marker.group(0)} is not followed by a ```console block")
        end = lines.index("```", i + 1)
        commands = [line[2:] for line in lines[i + 1:end] if line.startswith("$ ")]
        expect = int(marker["exit"] or 0)
        shown = "\n".join(f"$ {c}\n{session.run(c, expect)}".rstrip() for c in commands)
        if marker["id"] in session.outputs:
            raise ValueError(f"example id {marker['id']!r} is used twice")
        session.outputs[marker["id"]] = shown
        out += ["```console", shown, "```"]
        i = end + 1
    return replace_views("\n".join(out))


def replace_views(text: str) -> str:
    start, end = "<!-- views -->", "<!-- /views -->"
    if start not in text:
        return text
    head, rest = text.split(start, 1)
    return f"{head}{start}\n{views_markdown()}\n{end}{rest.split(end, 1)[1]}"


def views_markdown() -> str:
    """Each view of queries/*.sql: its name, file and header comment as written (the header is the documentation)."""
    parts = []
    for path in sorted((ROOT / "queries").glob("*.sql")):
        sql = path.read_text()
        header = []
        for line in sql.splitlines():
            if not line.startswith("--"):
                break
            header.append(line[3:] if line.startswith("-- ") else line[2:])
        name = re.search(r"CREATE OR REPLACE VIEW (\w+)", sql)[1]
        parts.append(f"### `{name}`\n\n`queries/{path.name}`\n\n```text\n" + "\n".join(header) + "\n```\n")
    return "\n".join(parts)


def check_quotes(text: str, outputs: dict[str, str]) -> list[str]:
    """Each number of a paragraph marked ``<!-- quotes: ID -->`` that none of the cited examples prints."""
    problems, lines = [], text.split("\n")
    for n, line in enumerate(lines):
        marker = QUOTES.fullmatch(line.strip())
        if not marker:
            continue
        ids = marker["ids"].split()
        missing = [i for i in ids if i not in outputs]
        if missing:
            problems.append(f"quotes an example that does not exist: {missing}")
            continue
        start = n
        while start > 0 and lines[start - 1].strip():
            start -= 1
        printed = {value(number) for i in ids for number in NUMBER.findall(outputs[i])}
        for number in NUMBER.findall("\n".join(lines[start:n])):
            if value(number) not in printed:
                problems.append(f"{number!r} (line {n}) is not in the output of {', '.join(ids)}")
    return problems


def value(number: str) -> tuple[float, bool]:
    """A number as quoted: 115.58 is the 115.580 a table prints, 43.1% is not 43.1."""
    return float(number.replace(",", "").rstrip("%")), number.endswith("%")


def normalised(text: str) -> str:
    for pattern, shown in VARIES:
        text = pattern.sub(shown, text)
    return text


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md"))


def generate(base: Path) -> tuple[dict[Path, str], dict[str, str]]:
    """Every page as it should read, and every example's output by id."""
    session = Session.start(base)
    return {page: render_page(page.read_text(), session) for page in pages()}, session.outputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page differs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="traceana-docs-") as base:
        rendered, outputs = generate(Path(base))
    failed = False
    for page, text in rendered.items():
        problems = check_quotes(text, outputs)
        for problem in problems:
            print(f"{page.relative_to(ROOT)}: {problem}", file=sys.stderr)
        failed |= bool(problems)
        if normalised(text) != normalised(page.read_text()):
            if args.check:
                print(f"{page.relative_to(ROOT)}: differs from what its commands print now", file=sys.stderr)
                failed = True
            else:
                page.write_text(text)
                print(f"rewrote {page.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
