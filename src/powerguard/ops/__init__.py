"""Operations: what an SRE runs against a deployment (``powerguard config check``, backups)."""
