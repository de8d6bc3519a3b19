"""The synchronizations of a rank (the store's ``syncs`` table) resolved to the device events they wait for:
``edges.py`` holds the rules every format shares (host waits, stream waits on host or device times); each format's
reader finds its own sync records (kineto/syncs.py, nsys/syncs.py, ascend/reader.py) and hands them to it."""
