"""A sqllogictest-style runner: ``.test`` files of small tables and queries, every query answered by
duckflock and compared with single-process DuckDB on the same files.

A file is records separated by blank lines; ``#`` starts a comment line::

    statement ok                      -- run in DuckDB to build the tables (before any query)
    CREATE TABLE t AS SELECT ...

    config driver_fallback_bytes 0    -- a Config field for this file's session

    partition t hash k 3              -- how t is stored: hash KEYS.. | range KEY | none, then a count
                                      -- (default: none 4, i.e. rows dealt over 4 partitions)

    query                             -- must equal DuckDB as a multiset of rows
    SELECT ...
    ----                              -- optional: the rows DuckDB must give too, tab-separated
    1	NULL

    query ordered                     -- must equal DuckDB row by row (the query orders totally)

    query ordered k                   -- as a multiset, and column k in DuckDB's sequence (ties)

    statement error unsupported       -- duckflock must refuse, with this text in its message
    SELECT ...

Comparing with DuckDB, not only with written rows, is what makes thousands of queries cheap to add;
the written rows pin DuckDB itself where a test wants that.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from duckflock.errors import DuckflockError
from duckflock.testing.compare import difference
from duckflock.testing.tables import make_table, oracle

# Broadcasts and gathered sorts off, and inputs streamed however small: the shapes of large data.
NO_BROADCAST = {"broadcast_threshold_bytes": 0, "range_sort_threshold_bytes": 0, "stream_min_bytes": 0}


@dataclass(frozen=True)
class Record:
    kind: str  # statement, query, error
    sql: str
    line: int
    ordered: bool = False
    order_columns: tuple[str, ...] = ()  # ordered by these columns only (ties may come in any order)
    expected: tuple[tuple[str, ...], ...] | None = None
    message: str = ""  # for error: text the refusal must contain


@dataclass(frozen=True)
class Partitioning:
    kind: str = "none"
    keys: tuple[str, ...] = ()
    count: int = 4


@dataclass
class TestFile:
    path: Path
    setup: list[Record] = field(default_factory=list)
    partitions: dict[str, Partitioning] = field(default_factory=dict)
    checks: list[Record] = field(default_factory=list)
    config: dict[str, int] = field(default_factory=dict)


def parse(path: Path) -> TestFile:
    out = TestFile(path)
    for start, lines in _blocks(path.read_text()):
        head = lines[0].split()
        if head[0] == "config":
            out.config[head[1]] = int(head[2])
            continue
        if head[0] == "partition":
            name, kind, *rest = head[1:]
            keys = tuple(rest[:-1]) if kind != "none" else ()
            out.partitions[name] = Partitioning(kind, keys, int(rest[-1]))
            continue
        body, expected = lines[1:], None
        if "----" in body:
            i = body.index("----")
            body, expected = body[:i], tuple(tuple(r.split("\t")) for r in body[i + 1 :])
        sql = "\n".join(body).strip()
        if not sql:
            raise ValueError(f"{path}:{start}: record without SQL")
        if head[:2] == ["statement", "ok"]:
            if out.checks:
                raise ValueError(f"{path}:{start}: statements must come before the queries")
            out.setup.append(Record("statement", sql, start))
        elif head[:2] == ["statement", "error"]:
            message = " ".join(head[2:]) or (expected[0][0] if expected else "")
            out.checks.append(Record("error", sql, start, message=message))
        elif head[0] == "query":
            ordered = head[1:2] == ["ordered"]
            columns = tuple(head[2:]) if ordered else ()
            out.checks.append(Record("query", sql, start, ordered and not columns, columns, expected))
        else:
            raise ValueError(f"{path}:{start}: unknown record {lines[0]!r}")
    return out


def _blocks(text: str) -> Iterator[tuple[int, list[str]]]:
    block: list[str] = []
    start = 0
    for n, line in enumerate([*text.splitlines(), ""], 1):
        if line.startswith("#"):
            continue
        if line.strip():
            if not block:
                start = n
            block.append(line.rstrip("\n"))
        elif block:
            yield start, block
            block = []


def build(test: TestFile, root: Path) -> None:
    """Run the setup statements in DuckDB and store every table it made as duckflock partitions."""
    con = duckdb.connect()
    for r in test.setup:
        con.execute(r.sql)
    for (name,) in con.sql("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall():
        p = test.partitions.get(name, Partitioning())
        make_table(root, name, con.table(name).to_arrow_table(), p.count, p.kind, p.keys)
    con.close()


@dataclass
class Outcome:
    record: Record
    status: str  # correct, refused (an expected refusal), wrong, failed (refused or erred when it must not)
    detail: str = ""


# Opens a session on a data directory with a file's config fields: duckflock.connect with the
# ranks, transport and config of the run.
SessionFactory = Callable[[str, dict], AbstractContextManager]


def run(test: TestFile, connect: SessionFactory) -> list[Outcome]:
    root = Path(tempfile.mkdtemp(prefix="duckflock-slt-"))
    try:
        build(test, root)
        ref = oracle(root)
        with connect(str(root), test.config) as db:
            return [_check(r, db, ref) for r in test.checks]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _check(r: Record, db, ref: duckdb.DuckDBPyConnection) -> Outcome:
    try:
        got = db.sql(r.sql).arrow()
    except DuckflockError as e:
        message = str(e)
        if r.kind == "error" and r.message.lower() in message.lower():
            return Outcome(r, "refused", message)
        return Outcome(r, "failed", f"refused: {message}")
    except Exception as e:  # anything but a clear duckflock error reaching the user is a defect
        return Outcome(r, "failed", f"{type(e).__name__}: {e}")
    if r.kind == "error":
        return Outcome(r, "failed", f"expected a refusal naming {r.message!r}, got {got.num_rows} rows")
    want = ref.sql(r.sql).to_arrow_table()
    problem = difference(got, want, list(r.order_columns) or None, in_order=r.ordered)
    if problem is None and r.expected is not None:
        problem = _against_written(want, r.expected)
    return Outcome(r, "correct" if problem is None else "wrong", problem or "")


def _against_written(want: pa.Table, rows: tuple[tuple[str, ...], ...]) -> str | None:
    text = [tuple(_text(v) for v in row) for row in zip(*(c.to_pylist() for c in want.columns), strict=True)]
    if sorted(text) != sorted(rows):
        return f"DuckDB gave {text}, the file says {list(rows)}"
    return None


def _text(v: object) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def summary(outcomes: list[Outcome]) -> dict[str, int]:
    counts = {"correct": 0, "refused": 0, "wrong": 0, "failed": 0}
    for o in outcomes:
        counts[o.status] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    """Run .test files and print per-file counts: python -m duckflock.testing.sqllogic DIR --ranks 2,3"""
    import argparse

    import duckflock

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--ranks", default="2,3")
    ap.add_argument("--transport", default="threads", choices=["threads", "mpi", "storage"])
    ap.add_argument(
        "--exchange-uri", default=None, help="with storage: where ranks exchange (default: a temp dir)"
    )
    ap.add_argument("--ranks-per-process", type=int, default=0, help="with mpi (default: all in one)")
    ap.add_argument(
        "--no-broadcast", action="store_true", help="broadcasts and gathered sorts off, streams of any size"
    )
    ap.add_argument(
        "--no-fallback", action="store_true", help="refuse instead of running on the driver: lists those"
    )
    args = ap.parse_args(argv)
    config: dict[str, int] = {}
    if args.no_broadcast:
        config |= NO_BROADCAST
    if args.no_fallback:
        config["driver_fallback_bytes"] = -1
    if args.ranks_per_process:
        config["ranks_per_process"] = args.ranks_per_process
    options: dict[str, object] = dict(config)
    if args.transport == "storage":
        options["exchange_uri"] = args.exchange_uri or tempfile.gettempdir()
    files = sorted(f for p in args.paths for f in ([p] if p.is_file() else p.rglob("*.test")))
    bad = 0
    for ranks in (int(r) for r in args.ranks.split(",")):
        total = {"correct": 0, "refused": 0, "wrong": 0, "failed": 0}
        for f in files:

            def session(d: str, extra: dict[str, int], n: int = ranks) -> duckflock.Session:
                return duckflock.connect(d, ranks=n, transport=args.transport, config={**options, **extra})

            outcomes = run(parse(f), session)
            counts = summary(outcomes)
            print(f"{ranks} ranks  {f.name:32} " + "  ".join(f"{k} {v}" for k, v in counts.items()))
            for o in outcomes:
                if o.status in ("wrong", "failed"):
                    print(f"    {o.status}: line {o.record.line}: {o.record.sql[:90]!r}: {o.detail[:200]}")
            total = {k: total[k] + counts[k] for k in total}
        bad += total["wrong"] + total["failed"]
        print(f"{ranks} ranks  {'all files':32} " + "  ".join(f"{k} {v}" for k, v in total.items()))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
