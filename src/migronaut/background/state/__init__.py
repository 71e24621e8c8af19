"""State and storage: the documents of ``_migronaut_background`` and
``_migronaut_background_partitions`` and everything that reads or moves them — the state store, the
partition store and its read-side aggregates, the stored shapes and the checks that refuse what
migronaut does not know, the status views and progress rows, the roll-up of a generation's counters,
registration through ``up``/``down`` and the ``requires`` between migrations."""
