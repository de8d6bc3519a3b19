"""The one exception type a user mistake raises; the CLI prints it as a single line and exits non-zero."""


class TraceanaError(Exception):
    """A problem with the user's input (file, layout, config, query), not a bug in traceana.

    The message must name the file or field and say what is wrong, in one line.
    """


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's first line for a one-line error, at most ``limit`` characters; its type's name when it says
    nothing (DuckDB can raise with an empty message: bytes that are not UTF-8 at the start of a JSON file)."""
    lines = str(exc).strip().splitlines()
    return lines[0][:limit] if lines else type(exc).__name__
