"""The user-facing session and result objects."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from duckflock.exec.driver import QueryOutcome
from duckflock.exec.stage import StageStats
from duckflock.plan.explain import explain_plan


@dataclass
class Result:
    """A finished query: the rows as Arrow plus how the query ran."""

    outcome: QueryOutcome

    def arrow(self) -> pa.Table:
        return self.outcome.table

    def df(self):
        return self.outcome.table.to_pandas()

    def pl(self):
        import polars as pl

        return pl.from_arrow(self.outcome.table)

    def fetchall(self) -> list[tuple]:
        cols = [c.to_pylist() for c in self.outcome.table.columns]
        return list(zip(*cols, strict=True))

    @property
    def stats(self) -> list[StageStats]:
        return self.outcome.stats

    @property
    def seconds(self) -> float:
        return self.outcome.seconds

    def show(self, max_rows: int = 20) -> None:
        from duckflock.cli.output import print_table

        print_table(self.outcome.table, max_rows=max_rows)

    def __repr__(self) -> str:
        t = self.outcome.table
        return f"<duckflock.Result {t.num_rows} rows x {t.num_columns} columns in {self.seconds:.3f} s>"


class Session:
    """Runs queries on a set of warm ranks. Backed by a driver (MPI) or a remote session."""

    def __init__(self, backend):
        self._backend = backend

    def sql(self, query: str, profile: bool = False) -> Result:
        return Result(self._backend.run(query, profile=profile))

    def explain(self, query: str) -> str:
        return explain_plan(self._backend.plan(query))

    def close(self) -> None:
        close = getattr(self._backend, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
