"""`traceana mcp`: the server over stdio with the SDK's own client, and its results' shape and size."""
