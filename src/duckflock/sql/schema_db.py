"""A DuckDB with the catalog's tables created empty: validates queries with DuckDB's own binder and
answers type questions about plan nodes exactly as the executing DuckDBs will."""

from __future__ import annotations

import functools
from collections.abc import Iterable

import duckdb
import pyarrow as pa

from duckflock import duckdb_avg
from duckflock.catalog import Catalog, TableInfo
from duckflock.errors import CatalogError, SqlError, duckdb_message
from duckflock.local_duckdb import restrict, set_time_zone
from duckflock.plan.nodes import Node
from duckflock.plan.render import render
from duckflock.sql.functions import AggregateNames, FunctionRow, function_rows
from duckflock.sqltext import quote_ident as q


class SchemaDB:
    def __init__(self, catalog: Catalog, only_dir: str | None = None, time_zone: str = ""):
        self.catalog = catalog
        self.con = duckdb.connect(config={"threads": 1})
        set_time_zone(self.con, time_zone)  # the result's TIMESTAMPTZ columns carry the zone
        duckdb_avg.register(self.con)  # plan nodes' SQL may finish a split AVG
        if only_dir is not None:  # binding reads files a query names: same limits as the ranks
            restrict(self.con, [only_dir])
        self._columns: dict[str, tuple[tuple[str, str], ...]] = {}
        self.define(catalog.tables.values())

    def define(self, tables: Iterable[TableInfo]) -> None:
        """Tables as a query reads them, (re)created where their columns differ: a lake table at
        another version (ingest/versions.py) may have other columns, or another name."""
        for info in tables:
            if self._columns.get(info.name) != info.columns:
                cols = ", ".join(f"{q(c)} {t}" for c, t in info.columns)
                self.con.execute(f"CREATE OR REPLACE TABLE {q(info.name)} ({cols})")
                self._columns[info.name] = info.columns

    @functools.cached_property
    def functions(self) -> list[FunctionRow]:
        return function_rows(self.con)

    @functools.cached_property
    def aggregate_names(self) -> AggregateNames:
        """DuckDB's aggregate functions (and aggregating macros), by lower-case name."""
        return AggregateNames(self.functions)

    @functools.cached_property
    def volatile_names(self) -> frozenset[str]:
        """DuckDB's VOLATILE functions (random, uuid, nextval, ...), lower-case."""
        return frozenset(f.name.lower() for f in self.functions if f.stability == "VOLATILE")

    @functools.cached_property
    def function_aliases(self) -> dict[str, str]:
        """DuckDB's function aliases to the names they stand for, lower-case."""
        return {f.name.lower(): f.alias_of.lower() for f in self.functions if f.alias_of is not None}

    @functools.cached_property
    def type_aliases(self) -> dict[str, str]:
        """DuckDB's type names to the types they stand for, lower-case (text -> VARCHAR); JSON is
        kept apart from the VARCHAR it is stored as."""
        rows = self.con.execute("SELECT DISTINCT type_name, logical_type FROM duckdb_types()").fetchall()
        return {n.lower(): t for n, t in rows if n.lower() != "json"}

    def describe(self, sql: str) -> list[tuple[str, str]]:
        """(name, type) of the query's result columns, or the binder's error as SqlError/CatalogError."""
        try:
            rel = self.con.sql(sql)  # binds without running
            return [(n, str(t)) for n, t in zip(rel.columns, rel.types, strict=True)]
        except duckdb.CatalogException as e:
            raise CatalogError(_clean(e)) from None
        except duckdb.Error as e:
            raise SqlError(_clean(e)) from None

    def arrow_schema(self, sql: str) -> pa.Schema:
        """The Arrow schema single-process DuckDB gives this query's result (run on empty tables).
        Where running it fails on empty tables although it binds (DuckDB 2.0 fails a FULL JOIN
        filtered by split_part() so), the same schema comes from empty columns of its types."""
        try:
            return self.con.sql(sql).to_arrow_table().schema
        except duckdb.Error as e:
            described = self.describe(sql)  # a query that does not bind raises here
            if not described:
                raise SqlError(_clean(e)) from None
        columns = ", ".join(f"CAST(NULL AS {t}) AS {q(n)}" for n, t in described)
        try:
            return self.con.sql(f"SELECT {columns} LIMIT 0").to_arrow_table().schema
        except duckdb.Error as e:
            raise SqlError(_clean(e)) from None

    def node_types(self, node: Node, exprs: list[str] | None = None) -> list[str]:
        """DuckDB types of ``exprs`` (default: all columns) evaluated over ``node``'s output."""
        sql = render(node, lambda scan: q(scan.table))
        if exprs is not None:
            sql = f"SELECT {', '.join(exprs)} FROM ({sql})"
        return [t for _, t in self.describe(sql)]

    def close(self) -> None:
        self.con.close()


def _clean(e: Exception) -> str:
    return duckdb_message(e)
