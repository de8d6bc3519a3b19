"""`traceana mcp`: the store served to coding assistants over the Model Context Protocol (needs the ``mcp`` extra)."""
