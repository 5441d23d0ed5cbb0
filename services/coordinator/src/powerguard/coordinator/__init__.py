"""PowerGuard coordinator: Outage saga (checkpoint every rank, then shut down, then restore)."""
