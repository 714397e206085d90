"""The duckflock command line."""
