"""Planning and sharding: what a migration file declares (the spec and the job a worker runs under
it) and how a pass cuts its documents into partitions — the plan a coordinator step commits, the
``_id`` and shard-key partitioners, the sharded collection's facts and the version index both plans
and lanes read through."""
