"""Counts and byte sizes for people to read, in decimal units throughout (1 KB = 1000 bytes)."""

from __future__ import annotations


def human(n: float, unit: str = "") -> str:
    """``human(1234)`` -> ``1.2K``; ``human(48_000, "B")`` -> ``48.0KB``; ``human(512, "B")`` -> ``512B``."""
    for suffix in ("", "K", "M", "G", "T"):
        if abs(n) < 1000 or suffix == "T":
            return f"{n:.0f}{suffix}{unit}" if suffix == "" else f"{n:.1f}{suffix}{unit}"
        n /= 1000
    return str(n)
