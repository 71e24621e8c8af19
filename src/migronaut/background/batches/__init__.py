"""Batch units of a lane: how one batch is read, written and recorded, one module per mode.

The lane skeleton (:mod:`migronaut.background.lanes.slices`) calls one interface,
:class:`~migronaut.background.batches.unit.BatchUnit`, implemented by

* :mod:`.plain` — declarative batches with guarded writes, checkpointed with the next intent;
* :mod:`.transactional` — declarative batches, each in one transaction with its checkpoint;
* :mod:`.step` — one call of the migration's ``step`` function per batch.

What they share lives in one place each: the resolved spec (:mod:`.documents`), reading a batch
(:mod:`.reading`), turning transforms into guarded updates (:mod:`.updates`), fenced checkpoints
and the error budget (:mod:`.checkpoints`), transactions and their retries
(:mod:`.transactions`), and how failures are told without document data (:mod:`.failures`).
"""
