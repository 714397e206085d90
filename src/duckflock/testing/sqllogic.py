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

    driver WITH RECURSIVE             -- this query runs whole on the driver, as a construct
    query                             -- not distributed yet: the refusal's name (errors.
    WITH RECURSIVE ...                -- NotDistributed.construct) contains this text

Every query must run distributed unless a ``driver`` line (in the spirit of sqllogictest's
``skipif``/``onlyif`` lines, it qualifies the record under it) says it runs on the driver and why: a
query that runs on the driver without one fails, and so does one with a line that now runs
distributed (the line is out of date). The driver fallback is thus off, except where declared; a
file's ``config driver_fallback_bytes`` still sets its limit (-1: off, refused instead). An error in
the planner (errors.InternalError) is never taken for a refusal.

Comparing with DuckDB, not only with written rows, is what makes thousands of queries cheap to add;
the written rows pin DuckDB itself where a test wants that. ``python -m duckflock.testing.sqllogic
--counts tests/sql`` counts how the queries ran: distributed, on the driver (declared or not, by
construct), refused (by construct), internal errors.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from duckflock.errors import DuckflockError, InternalError, NotDistributed
from duckflock.plan.stages import OnDriver
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
    driver: str | None = None  # declared to run on the driver: text of the refusal's construct


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
        driver = None
        if head[0] == "driver":  # qualifies the record under it
            driver = " ".join(head[1:])
            if not driver or len(lines) < 2 or not lines[1].startswith("query"):
                raise ValueError(f"{path}:{start}: a driver line names a construct, above a query record")
            lines = lines[1:]
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
            out.checks.append(
                Record("query", sql, start, ordered and not columns, columns, expected, driver=driver)
            )
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
    # How the query ran: distributed, driver (whole on the driver), refused (not distributed, by
    # name), internal (a bug: errors.InternalError, or any non-duckflock exception), error (another
    # duckflock error, e.g. a user error a record expects)
    how: str = "distributed"
    construct: str = ""  # for driver and refused: the construct not distributed


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
        result = db.sql(r.sql)
    except InternalError as e:
        return Outcome(r, "failed", str(e), how="internal")
    except DuckflockError as e:
        message = str(e)
        how, construct = ("refused", e.construct) if isinstance(e, NotDistributed) else ("error", "")
        if r.kind == "error" and r.message.lower() in message.lower():
            return Outcome(r, "refused", message, how, construct)
        return Outcome(r, "failed", f"refused: {message}", how, construct)
    except Exception as e:  # anything but a clear duckflock error reaching the user is a defect
        return Outcome(r, "failed", f"{type(e).__name__}: {e}", how="internal")
    got = result.arrow()
    on_driver = result.on_driver
    how, construct = ("driver", on_driver.construct) if on_driver is not None else ("distributed", "")
    if r.kind == "error":
        answered = f"expected a refusal naming {r.message!r}, got {got.num_rows} rows"
        return Outcome(r, "failed", answered, how, construct)
    misplaced = _driver_problem(r, on_driver)
    if misplaced is not None:
        return Outcome(r, "failed", misplaced, how, construct)
    want = ref.sql(r.sql).to_arrow_table()
    problem = difference(got, want, list(r.order_columns) or None, in_order=r.ordered)
    if problem is None and r.expected is not None:
        problem = _against_written(want, r.expected)
    return Outcome(r, "correct" if problem is None else "wrong", problem or "", how, construct)


def _driver_problem(r: Record, on_driver: OnDriver | None) -> str | None:
    """Where the query ran, against the record's ``driver`` line (None: as declared)."""
    if on_driver is None:
        if r.driver is not None:
            return f"ran distributed, but a driver line says it runs on the driver ({r.driver}): remove it"
        return None
    if r.driver is None:
        return f"{on_driver.describe()} [{on_driver.construct}], without a driver line saying so"
    if r.driver.lower() not in on_driver.construct.lower():
        return f"{on_driver.describe()} [{on_driver.construct}]; its driver line names {r.driver!r}"
    return None


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


HOW = ("distributed", "driver", "refused", "internal", "error")


def counts(outcomes: list[tuple[Path, Outcome]]) -> str:
    """How the queries ran, as text: distributed, on the driver (declared by a driver line or not,
    by construct), refused (by construct), internal errors (each), other errors. The share
    distributed is of the records whose query DuckDB answers (all but the other errors)."""
    by_how = Counter(o.how for _, o in outcomes)
    valid = len(outcomes) - by_how["error"]
    share = f" ({100 * by_how['distributed'] / valid:.1f}% of {valid} valid)" if valid else ""
    lines = [f"{len(outcomes)} records: " + ", ".join(f"{h} {by_how[h]}" for h in HOW) + share]
    groups = {
        "on the driver, declared": [o for _, o in outcomes if o.how == "driver" and o.record.driver],
        "on the driver, undeclared": [o for _, o in outcomes if o.how == "driver" and not o.record.driver],
        "refused": [o for _, o in outcomes if o.how == "refused"],
    }
    for title, group in groups.items():
        if group:
            lines.append(f"  {title} ({len(group)}):")
            for construct, n in Counter(o.construct for o in group).most_common():
                lines.append(f"    {n:5}  {construct}")
    internal = [(f, o) for f, o in outcomes if o.how == "internal"]
    if internal:
        lines.append(f"  internal errors ({len(internal)}):")
        lines += [f"    {f.name}:{o.record.line}: {o.detail.splitlines()[0][:240]}" for f, o in internal]
    return "\n".join(lines)


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
        "--counts",
        action="store_true",
        help="also count how the queries ran: distributed, on the driver and refused (by construct), "
        "internal errors",
    )
    args = ap.parse_args(argv)
    config: dict[str, int] = {}
    if args.no_broadcast:
        config |= NO_BROADCAST
    if args.ranks_per_process:
        config["ranks_per_process"] = args.ranks_per_process
    options: dict[str, object] = dict(config)
    if args.transport == "storage":
        options["exchange_uri"] = args.exchange_uri or tempfile.gettempdir()
    files = sorted(f for p in args.paths for f in ([p] if p.is_file() else p.rglob("*.test")))
    bad = 0
    for ranks in (int(r) for r in args.ranks.split(",")):
        total = {"correct": 0, "refused": 0, "wrong": 0, "failed": 0}
        every: list[tuple[Path, Outcome]] = []
        for f in files:

            def session(d: str, extra: dict[str, int], n: int = ranks) -> duckflock.Session:
                return duckflock.connect(d, ranks=n, transport=args.transport, config={**options, **extra})

            outcomes = run(parse(f), session)
            every += [(f, o) for o in outcomes]
            counted = summary(outcomes)
            print(f"{ranks} ranks  {f.name:32} " + "  ".join(f"{k} {v}" for k, v in counted.items()))
            for o in outcomes:
                if o.status in ("wrong", "failed"):
                    print(f"    {o.status}: line {o.record.line}: {o.record.sql[:90]!r}: {o.detail[:200]}")
            total = {k: total[k] + counted[k] for k in total}
        bad += total["wrong"] + total["failed"]
        print(f"{ranks} ranks  {'all files':32} " + "  ".join(f"{k} {v}" for k, v in total.items()))
        if args.counts:
            print(f"{ranks} ranks  " + counts(every))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
