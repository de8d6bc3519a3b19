"""The one exception type a user mistake raises; the CLI prints it as a single line and exits non-zero."""


class TraceanaError(Exception):
    """A problem with the user's input (file, layout, config, query), not a bug in traceana.

    The message must name the file or field and say what is wrong, in one line.
    """
