"""How every duckflock process opens its DuckDB: sized, quiet, and optionally confined to a directory.

Below every layer: the ranks (exec/), the planner's schema DuckDB (sql/) and loading (ingest/) use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import duckdb
import duckdb.sqltypes
import pyarrow as pa

from duckflock import duckdb_avg
from duckflock.errors import DuckflockError, duckdb_message
from duckflock.sqltext import quote_ident as q
from duckflock.sqltext import sql_literal


def memory_limit(memory_bytes: int) -> str:
    """DuckDB's memory_limit setting for ``memory_bytes`` (at least 64 MB)."""
    return f"{max(memory_bytes >> 20, 64)}MB"


# DuckDB's defaults for when its allocator hands freed memory back: after a task, once a thread's
# peak allocation passed the first; after freeing more than the second at once.
_FLUSH_BYTES = 128 << 20
_BULK_FLUSH_BYTES = 512 << 20


def open_duckdb(
    threads: int,
    memory_bytes: int,
    only_dir: str | None = None,
    temp_dir: str | None = None,
    max_temp_bytes: int = 0,
    time_zone: str = "",
    ranks_on_node: int = 1,
    object_prefixes: Sequence[str] | None = None,
) -> duckdb.DuckDBPyConnection:
    """A DuckDB for one rank. With ``only_dir`` its SQL can read files there and nowhere else; it
    spills into ``temp_dir`` (at most ``max_temp_bytes`` when set); ``time_zone``: the session's
    (empty: this host's). ``object_prefixes`` (not None): it reads ``s3://`` objects
    (storage/objects.py), and where confined, those under these prefixes besides ``only_dir``.
    None where the catalog names no objects: registering costs an import of fsspec."""
    settings: dict[str, str | bool | int | float | list[str]] = {
        "threads": threads,
        "memory_limit": memory_limit(memory_bytes),
        # Row order is only promised where the query says ORDER BY; dropping it saves work.
        "preserve_insertion_order": False,
        # DuckDB's thresholds are for one instance doing all of a node's work; each of the node's
        # ranks does its share, and keeps freed memory until it reaches the same share of them: the
        # ranks together then hold no more freed memory than one instance would, in the same time.
        "allocator_flush_threshold": f"{_FLUSH_BYTES // max(1, ranks_on_node)}B",
        "allocator_bulk_deallocation_flush_threshold": f"{_BULK_FLUSH_BYTES // max(1, ranks_on_node)}B",
    }
    if temp_dir is not None:
        settings["temp_directory"] = temp_dir
    if max_temp_bytes:
        settings["max_temp_directory_size"] = f"{max(max_temp_bytes >> 20, 1)}MB"
    con = duckdb.connect(config=settings)
    set_time_zone(con, time_zone)
    con.execute("SET enable_progress_bar = false")  # else every rank draws one into the terminal
    # Between ranks every type must survive Arrow as itself: by default HUGEINT arrives as
    # DECIMAL(38,0), UUID and JSON as VARCHAR, and a function of them downstream answers differently.
    con.execute("SET arrow_lossless_conversion = true")
    # DuckDB pushes a grouping below a join when its estimates say the grouping shrinks the join's
    # input; a stage's small exchange input (whose size DuckDB knows exactly) then waits for a
    # grouping of the whole other side (TPC-H Q18's last join: a few hundred orders waited for the
    # grouping of a rank's whole share of lineitem).
    con.execute("SET disabled_optimizers = 'partial_aggregate_pushdown'")
    duckdb_avg.register(con)  # a split AVG's last step
    if object_prefixes is not None:
        from duckflock.storage import objects

        objects.register(con)
    if only_dir is not None:
        restrict(con, [only_dir, *([temp_dir] if temp_dir else []), *(object_prefixes or ())])
    return con


# Types whose Arrow form, as DuckDB's own .arrow() gives it, has lost values: a UHUGEINT past
# 2^127 is a negative DECIMAL, a TIMETZ has lost its offset, a BIT is its internal bytes. Results
# hold that form; Python values and printed tables made from it would be wrong.
_LOSSY_IN_ARROW = {"uhugeint", "bit", "time with time zone"}


def lossy_in_arrow(typ: duckdb.sqltypes.DuckDBPyType) -> bool:
    """Whether the type, or a type nested in it (not a field name or an ENUM value), is lossy."""
    if typ.id in _LOSSY_IN_ARROW:
        return True
    if typ.id in ("list", "array", "struct", "map", "union"):
        return any(isinstance(t, duckdb.sqltypes.DuckDBPyType) and lossy_in_arrow(t) for _, t in typ.children)
    return False


def check_exact_from_arrow(names: Sequence[str], types: Sequence[str], what: str) -> None:
    """Raise DuckflockError where a result column's type does not survive DuckDB's Arrow form."""
    for name, typ in zip(names, types, strict=False):
        if lossy_in_arrow(duckdb.sqltype(typ)):
            raise DuckflockError(
                f"column {name!r} of type {typ} cannot be made into {what} exactly from its Arrow form: "
                "CAST it to VARCHAR in the query, or take the Arrow result (as DuckDB's .arrow() gives it)"
            )


def arrow_exact(con: duckdb.DuckDBPyConnection, sql: str, exchanged: bool = False) -> str:
    """``sql``, failing with a message where DuckDB's Arrow form of a value would be wrong: an
    INTERVAL's time part goes to Arrow in nanoseconds, multiplied without an overflow check, and
    past 2,562,047 hours it wraps around silently, also inside a LIST, STRUCT, MAP or UNION; a
    UNION whose member is NULL becomes a NULL UNION (Arrow's unions have no validity of their own:
    read back, written to a file or converted to pandas it is NULL, where DuckDB's is not).
    ``exchanged``: the rows go to another rank's DuckDB, which would read an ENUM back as VARCHAR
    (ordered as text), an unnamed STRUCT as a named one and a VARIANT with narrower inner types;
    the planner sends the types it sees to the driver, this stops the rest."""
    rel = con.sql(sql)  # bound, not run
    for kind, why in _NOT_EXCHANGED.items() if exchanged else ():
        if any(_holds(t, kind) for t in rel.types):
            raise DuckflockError(f"unsupported SQL construct: {why}")
    tests = [(_interval_too_long, _TOO_LONG), (_union_of_null, _NULL_MEMBER)]
    checks: dict[str, str] = {}
    for c, t in zip(rel.columns, rel.types, strict=True):
        v = q(c)
        for test, message in tests:
            found = _anywhere(test, v, t, 0)
            if found is not None:
                checks[v] = f"CASE WHEN {found} THEN error({message}) ELSE {checks.get(v, v)} END"
    if not checks:
        return sql
    return f"SELECT * REPLACE ({', '.join(f'{e} AS {v}' for v, e in checks.items())}) FROM ({sql})"


def _interval_too_long(v: str, t: duckdb.sqltypes.DuckDBPyType) -> str | None:
    if t.id != "interval":
        return None
    micros = (
        f"datepart('hour', {v}) * 3600000000 + datepart('minute', {v}) * 60000000"
        f" + datepart('microseconds', {v})"
    )
    return f"abs({micros}) > {_ARROW_MAX_MICROS}"


def _union_of_null(v: str, t: duckdb.sqltypes.DuckDBPyType) -> str | None:
    if t.id != "union":
        return None
    members = [sql_literal(n) for n, _ in t.children[1:]]  # the first child is the tag
    null_member = " OR ".join(f"(union_tag({v}) = {m} AND union_extract({v}, {m}) IS NULL)" for m in members)
    return f"({v} IS NOT NULL AND ({null_member}))"


def _anywhere(
    test: Callable[[str, duckdb.sqltypes.DuckDBPyType], str | None], v: str, t: object, depth: int
) -> str | None:
    """SQL true where ``test`` holds for value ``v`` of type ``t`` or any value nested in it; None
    when it cannot (``t`` holds no type it tests, or is an ARRAY's size, not a type)."""
    if not isinstance(t, duckdb.sqltypes.DuckDBPyType):
        return None
    parts = [test(v, t)]
    if t.id in ("list", "array"):
        x = f"__x{depth}"
        inner = _anywhere(test, x, t.children[0][1], depth + 1)
        if inner is not None:
            parts.append(f"list_bool_or(list_transform({v}, lambda {x}: {inner}))")
    elif t.id == "map":
        parts += [
            _anywhere(test, f"map_{side}s({v})", duckdb.list_type(child), depth)
            for side, (_, child) in zip(("key", "value"), t.children, strict=True)
            if isinstance(child, duckdb.sqltypes.DuckDBPyType)
        ]
    elif t.id == "tuple":  # an unnamed STRUCT (row(...)): its fields by position
        parts += [
            _anywhere(test, f"struct_extract({v}, {i})", c, depth) for i, (_, c) in enumerate(t.children, 1)
        ]
    elif t.id in ("struct", "union"):  # a UNION's first child is its tag
        extract = "struct_extract" if t.id == "struct" else "union_extract"
        children = t.children if t.id == "struct" else t.children[1:]
        parts += [_anywhere(test, f"{extract}({v}, {sql_literal(n)})", c, depth) for n, c in children]
    found = [f"coalesce({p}, false)" for p in parts if p is not None]
    return " OR ".join(found) if found else None


# Types another rank's DuckDB reads back from Arrow as another type.
_NOT_EXCHANGED = {
    "enum": "ENUM values (made where the planner did not see them): across ranks they would compare "
    "as text; cast them to VARCHAR",
    "tuple": "unnamed STRUCT values ((a, b) as a value): across ranks their fields would be named "
    "element1, ...; name them ({'a': a, 'b': b})",
    "variant": "VARIANT values: across ranks their inner types would narrow (UTINYINT to INT16, "
    "DECIMAL(10,2) to DECIMAL(3,2)); cast them to a type",
}


def _holds(t: object, kind: str) -> bool:
    """Whether DuckDB type ``t`` is, or holds, a ``kind`` (a type id: enum, tuple, ...)."""
    if not isinstance(t, duckdb.sqltypes.DuckDBPyType):
        return False  # an ARRAY's size
    if t.id == kind:
        return True
    nested = ("list", "array", "map", "struct", "tuple", "union")
    return t.id in nested and any(_holds(c, kind) for _, c in t.children)


_ARROW_MAX_MICROS = (2**63 - 1) // 1000  # nanoseconds in an int64
_NULL_MEMBER = sql_literal(
    "a UNION whose member is NULL cannot be given exactly as Arrow: it reads back as NULL"
)
_TOO_LONG = sql_literal("an INTERVAL of over 2562047 hours cannot be exchanged exactly (as Arrow)")


def fetch_as_duckdb_returns(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    keep_order: bool = False,
    ended: Callable[[], None] | None = None,
) -> pa.Table:
    """A result for the user: Arrow types as single-process DuckDB gives them (not the lossless
    ones ranks exchange); ``keep_order`` for rows that already arrive in their final order;
    ``ended`` is called as soon as the query has ended (a profile is taken before the next)."""
    con.execute("SET arrow_lossless_conversion = false")
    if keep_order:
        con.execute("SET preserve_insertion_order = true")
    try:
        table = con.sql(arrow_exact(con, sql)).to_arrow_table()
        if ended is not None:
            ended()
        return table
    finally:
        con.execute("SET arrow_lossless_conversion = true")
        if keep_order:
            con.execute("SET preserve_insertion_order = false")


def restrict(con: duckdb.DuckDBPyConnection, dirs: list[str]) -> None:
    """No file, URL or extension outside ``dirs``; cannot be undone on this connection."""
    con.execute(f"SET allowed_directories = {sql_literal(dirs)}")
    con.execute("SET enable_external_access = false")


@contextmanager
def joins_as_written(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Plan the queries started inside with DuckDB's join reordering off: each join builds its right
    side and probes with its left (plan/streaming.py). The setting is the whole database's: no other
    query on it may be planned meanwhile."""
    settings = con.cursor()  # ``con`` has the started query's result open by the time it is reset
    try:
        (old,) = settings.sql("SELECT current_setting('disabled_optimizers')").fetchall()[0]
        off = ",".join(o for o in (old, "join_order", "build_side_probe_side") if o)
        settings.execute(f"SET disabled_optimizers = {sql_literal(off)}")
        try:
            yield
        finally:
            settings.execute(f"SET disabled_optimizers = {sql_literal(old)}")
    finally:
        settings.close()


def set_time_zone(con: duckdb.DuckDBPyConnection, time_zone: str) -> None:
    """The database's TimeZone (its cursors' too); empty: leave this host's. Set after connecting:
    as a connect setting it would need the ICU extension loaded first."""
    if time_zone:
        try:
            con.execute(f"SET GLOBAL TimeZone = {sql_literal(time_zone)}")
        except duckdb.Error as e:
            raise DuckflockError(f"time_zone {time_zone!r}: {duckdb_message(e)}") from None


def check_time_zone(time_zone: str) -> None:
    """Raise DuckflockError where DuckDB does not know the zone."""
    con = duckdb.connect()
    try:
        set_time_zone(con, time_zone)
    finally:
        con.close()


def arrow_time_zone(schema: pa.Schema) -> str | None:
    """The zone of a result's TIMESTAMPTZ columns (top-level or nested), if any: the session's."""

    def zone(t: pa.DataType) -> str | None:
        if pa.types.is_timestamp(t) and t.tz:
            return t.tz
        return next((z for i in range(t.num_fields) if (z := zone(t.field(i).type))), None)

    return next((z for f in schema if (z := zone(f.type))), None)


def local_time_zone() -> str:
    """The TimeZone a DuckDB opened here starts with (from ``TZ`` or the host's setting)."""
    with duckdb.connect() as con:
        return str(con.execute("SELECT current_setting('TimeZone')").fetchall()[0][0])


def is_ctrl_c(e: Exception) -> bool:
    """DuckDB's Python client ends a query on Ctrl-C with this error, not KeyboardInterrupt; and a
    Ctrl-C that lands in a Python reader DuckDB runs (a streamed input, an Arrow table's schema)
    comes back inside its error."""
    if type(e) is RuntimeError and str(e) == "Query interrupted":
        return True
    return isinstance(e, duckdb.Error) and "KeyboardInterrupt" in str(e)


_CLEANUP_TRIES = 50


def drop_views(con: duckdb.DuckDBPyConnection, views: Sequence[str], registered: Sequence[str] = ()) -> None:
    """Drop ``views`` and unregister ``registered`` after a stage, also after a failure. A failed
    query's connections are interrupted every 0.1 s until the rank leaves it (exec/resources/runtime.py), and
    an interrupt that lands inside a DROP fails it: a view left behind would refuse the next
    query's table of that name. So each one is tried again; an interrupt needs the statement to be
    running, which takes microseconds of every 0.1 s."""
    steps = [lambda n=n: con.execute(f"DROP VIEW IF EXISTS {n}") for n in views]
    steps += [lambda n=n: con.unregister(n) for n in registered]
    for step in steps:
        for attempt in range(_CLEANUP_TRIES):
            try:
                step()
                break
            except duckdb.InterruptException:
                if attempt == _CLEANUP_TRIES - 1:
                    raise
            except duckdb.Error:
                break  # not ours to report: the caller reports the query's own failure
