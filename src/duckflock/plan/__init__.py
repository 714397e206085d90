"""Logical nodes, distribution rules that add exchanges, stages, SQL rendering and explain."""
