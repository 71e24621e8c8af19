"""Lanes: one lane turn (a slice) on a held partition — claim, the lease keeper and the shared
control reads, the turn's shared state, batches (the units themselves are in
``background/batches/``), key ranges, the wire commands, the stamped diff, pacing, riding out an
outage and settling the lease exactly one way."""
