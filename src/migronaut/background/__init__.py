"""Background migrations: long data rewrites in ``_id`` ranges, worked by lanes under leases
kept in MongoDB."""
