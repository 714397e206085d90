"""The one compiled module: the exchange's row scatter (src/duckflock/exchange/scatter.py says why).
Always built, so an install without a C compiler fails here instead of running without it; the
rest of the project is described in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "duckflock.exchange._scatter",
            sources=["src/duckflock/exchange/_scatter.c"],
            extra_compile_args=["-O3"],
        )
    ]
)
