"""Arrow Flight SQL: ``duckflock serve`` (server.py), its messages, metadata answers and auth."""
