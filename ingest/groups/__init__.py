"""Which process group and dimension each collective belongs to, and which instance it is across ranks.
communicators.py decides groups and dims (the trace's own groups, stream identity, timing matches, fingerprints);
matching.py matches each rank's communicators to groups by the timing of their collectives; instances.py gives one
collective the same instance number on every rank."""
