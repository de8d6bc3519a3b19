"""A Kineto file's traceEvents array streamed to DuckDB as an array of records through a pipe, and the document
around it (distributedInfo, baseTimeNanoseconds, ...) parsed on its own.

DuckDB reads a top-level array of records in one pass of about 0.28 s for the 109k events (28 MB) of
hta_rank3of8_6steps, where the whole document, the events one value of it, took 0.56 s and left one list to unnest.
Kineto writes the array as one value among a few small ones, so a writer thread finds where it starts (the
``"traceEvents": [`` in the first bytes) and, holding back the last bytes, where it ends (the last ``]`` after which
the document closes: :func:`_close`), and passes the bytes in between to a FIFO that DuckDB reads. Nothing is
copied to disk and a .gz file is inflated on the way. A file laid out otherwise raises :class:`Unsplit` (or DuckDB
finds the bytes malformed): the caller then reads the document whole, as before.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

HEAD_MAX = 16 << 20  # the array must start in this many first bytes
TAIL_MAX = 4 << 20   # ... and end in this many last ones
CHUNK = 1 << 20
_START = re.compile(rb'"traceEvents"\s*:\s*\[')


class Unsplit(Exception):
    """The file is not one document with a traceEvents array that :func:`events_pipe` can find."""


class Pipe:
    """The FIFO DuckDB reads the array from (``path``), and the document around it once the writer is done."""

    def __init__(self, file: Path, folder: Path) -> None:
        self.file, self.path = file, folder / "traceEvents.json"
        self.writer = threading.Thread(target=_write, args=(self,), name="kineto-events", daemon=True)
        self.rest: bytes | None = None  # the file with the array emptied: b'{..."traceEvents": [], ...}'
        self.error: BaseException | None = None
        self._folder = folder

    def document(self) -> Path:
        """A file of the document around the array, once the writer is done; :class:`Unsplit` when the writer did
        not pass the array whole."""
        self.finish()
        if self.error is not None or self.rest is None:
            raise Unsplit(str(self.error))
        path = self._folder / "document.json"
        path.write_bytes(self.rest)
        return path

    def finish(self) -> None:
        """Wait for the writer; one that nobody read (DuckDB stopped, or never opened the FIFO) is released first:
        its open or write returns once a reader came and went."""
        if self.writer.is_alive():
            with contextlib.suppress(OSError):
                os.close(os.open(self.path, os.O_RDONLY | os.O_NONBLOCK))
        self.writer.join()


@contextlib.contextmanager
def events_pipe(file: Path) -> Iterator[Pipe]:
    """A :class:`Pipe` whose writer streams ``file``'s traceEvents array: read ``pipe.path`` inside the block,
    then ``pipe.document()``. The FIFO and the document are removed on leaving."""
    folder = Path(tempfile.mkdtemp(prefix="traceana-kineto-"))
    pipe = Pipe(file, folder)
    os.mkfifo(pipe.path)
    pipe.writer.start()
    try:
        yield pipe
    finally:
        pipe.finish()
        shutil.rmtree(folder, ignore_errors=True)


def _write(pipe: Pipe) -> None:
    """The writer thread: the array's bytes into the FIFO, the rest into ``pipe.document``. The FIFO is opened
    first, whatever follows, so that DuckDB's open returns and its read ends."""
    try:
        opener = gzip.open if pipe.file.name.endswith(".gz") else open
        with open(pipe.path, "wb") as sink, opener(pipe.file, "rb") as source:
            head = b""
            while (start := _START.search(head)) is None:
                if len(head) > HEAD_MAX or not (chunk := source.read(CHUNK)):
                    raise Unsplit("no traceEvents array near the start")
                head += chunk
            prefix, held = head[:start.end() - 1], bytearray(head[start.end() - 1:])
            while chunk := source.read(CHUNK):
                held += chunk
                if len(held) > TAIL_MAX + CHUNK:
                    sink.write(held[:-TAIL_MAX])
                    del held[:-TAIL_MAX]
            end, pipe.rest = _close(prefix, held)
            sink.write(held[:end + 1])
    except BaseException as exc:  # handed to the caller with the pipe
        pipe.error = exc


def _close(prefix: bytes, held: bytearray) -> tuple[int, bytes]:
    """(index in ``held`` of the array's closing bracket, the document with the array emptied): the last ``]``
    that closes an object's list (after a ``}``, or the ``[`` of an empty one) and after which ``prefix`` + ``[]``
    + the rest parses as one JSON object. A bracket inside the events leaves the rest of them after the object (not
    JSON); one closing a later list of objects passes here, and DuckDB then finds that list's key after the events
    and refuses them. Kineto writes strings after the events (traceName, the profiler's log lines)."""
    end, tries = len(held), 0
    while (end := held.rfind(b"]", 0, end)) >= 0 and tries < 64:
        if _last_byte(held, end) not in (b"}", b"["):
            continue
        tries += 1
        document = prefix + b"[]" + bytes(held[end + 1:])
        try:
            if isinstance(json.loads(document), dict):
                return end, document
        except ValueError:
            continue
    raise Unsplit("no end of the traceEvents array in the last bytes")


def _last_byte(held: bytearray, end: int) -> bytes:
    """The last byte before ``end`` that is not JSON whitespace."""
    i = end - 1
    while i >= 0 and held[i] in b" \t\r\n":
        i -= 1
    return bytes(held[i:i + 1])
