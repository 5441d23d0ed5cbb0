"""``powerguard`` command line (typer + rich)."""
