"""TPC-H data generation with ``tpchgen-cli`` into a duckflock data directory.

Layout: ``DIR/<table>/<table>.<i>.parquet`` for parts ``i = 1..parts`` (catalog partition ``i - 1``);
nation and region are tiny and come as the single file ``DIR/<table>/<table>.parquet``.

How the tables are partitioned (recorded in the catalog):

* orders (o_orderkey), customer (c_custkey), part (p_partkey) and supplier (s_suppkey) are range
  partitions: tpchgen splits them into contiguous ranges of the primary key.
* lineitem (l_orderkey) and partsupp (ps_partkey) are range partitions *aligned* with orders and part:
  part ``i`` of lineitem holds exactly the lineitems of the orders in part ``i`` of orders, and likewise
  for partsupp and part. tpchgen may split a child table by row count, so that some rows of an order
  straddle into the neighbouring part; such parts are rewritten after generation. Aligned ranges make
  orders ⋈ lineitem and part ⋈ partsupp co-located joins: equal partition numbers meet on the same rank,
  so these joins move no rows.
* nation and region: one partition, no partitioning.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from duckflock.catalog import Catalog, PartitionInfo, TableInfo
from duckflock.errors import DuckflockError
from duckflock.ingest.load import describe, parquet_stats
from duckflock.ingest.widths import with_widths
from duckflock.plan.sql_text import read_files
from duckflock.sqltext import quote_ident, sql_literal

# Largest first, so the thread pool starts the longest jobs early.
RANGE_KEYS = {
    "lineitem": "l_orderkey",
    "orders": "o_orderkey",
    "partsupp": "ps_partkey",
    "part": "p_partkey",
    "customer": "c_custkey",
    "supplier": "s_suppkey",
}
SINGLE_FILE = ("nation", "region")
TABLES = (*RANGE_KEYS, *SINGLE_FILE)
ALIGNED = {"lineitem": "orders", "partsupp": "part"}  # child -> the table whose key ranges it follows

Bounds = tuple[Any, Any]  # (exclusive low, inclusive high) of one key type; None means unbounded


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def tpchgen_executable() -> str:
    """tpchgen-cli of this Python environment (it is a dependency), else the one on PATH."""
    local = Path(sys.executable).parent / "tpchgen-cli"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("tpchgen-cli")
    if found is None:
        raise DuckflockError("tpchgen-cli not found; install it with `pip install tpchgen-cli`")
    return found


def part_file(out: Path, table: str, part: int | None) -> Path:
    """Where tpchgen writes ``table`` part ``part`` (1-based; None for a single-file table)."""
    return out / table / (f"{table}.parquet" if part is None else f"{table}.{part}.parquet")


@contextmanager
def _progress(enabled: bool) -> Iterator[Progress]:
    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not (enabled and console.is_terminal),
    ) as bar:
        yield bar


def _run_parallel(tasks: list[Callable[[], None]], jobs: int, bar: Progress, label: str) -> None:
    """Run tasks on ``jobs`` threads, counting each on ``bar`` as it ends; the first failure cancels
    what has not started and is raised."""
    task = bar.add_task(label, total=len(tasks))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        pending = {pool.submit(t) for t in tasks}
        while pending:
            # Not FIRST_EXCEPTION: without a failure that waits for all, and the bar stood at 0 till the end.
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                if (error := f.exception()) is not None:
                    for p in pending:
                        p.cancel()
                    raise error
                bar.advance(task)


def _tpchgen(
    exe: str, sf: float, tables: list[str], out: Path, threads: int, parts: list[int] | None
) -> Callable[[], None]:
    """A task running one tpchgen-cli process (``parts`` = [part, of]: one part of each table)."""

    def run() -> None:
        cmd = [exe, "parquet", "-s", format(sf, "g"), "--tables", ",".join(tables), "-n", str(threads)]
        cmd += ["-q", "--overwrite", "-o", str(out)]
        if parts is not None:
            cmd += ["--part", str(parts[0]), "--parts", str(parts[1])]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise DuckflockError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")

    return run


def _generate(sf: float, out: Path, parts: int, jobs: int, bar: Progress) -> None:
    """Run tpchgen-cli: one process per part for all partitioned tables, one for nation and region.

    A tpchgen process spends about a CPU second on setup (its text pool) whatever it generates, so
    one process per part rather than per (table, part) saves that for every table.
    """
    exe = tpchgen_executable()
    concurrent = min(jobs, parts + 1)
    threads = max(1, _cores() // concurrent)  # several processes at once: do not oversubscribe
    small = out / ".tpchgen-small"
    shutil.rmtree(small, ignore_errors=True)
    tasks = [_tpchgen(exe, sf, list(RANGE_KEYS), out, threads, [i, parts]) for i in range(1, parts + 1)]
    tasks.append(_tpchgen(exe, sf, list(SINGLE_FILE), small, 1, None))
    _run_parallel(tasks, concurrent, bar, f"tpchgen sf={sf:g}")
    for t in SINGLE_FILE:
        part_file(out, t, None).parent.mkdir(parents=True, exist_ok=True)
        os.replace(small / f"{t}.parquet", part_file(out, t, None))
    small.rmdir()


def _interval_sql(key: str, bounds: Bounds) -> str:
    k = quote_ident(key)
    lo, hi = bounds
    conds = ([f"{k} > {sql_literal(lo)}"] if lo is not None else []) + (
        [f"{k} <= {sql_literal(hi)}"] if hi is not None else []
    )
    return " AND ".join(conds) or "true"


def parent_intervals(parent_max: list[object]) -> list[Bounds]:
    """Key intervals of the parent's parts, (max of part i-1, max of part i], open at both ends.

    An empty parent part (max None) gets an empty interval; the first part takes everything below and
    the last everything above, so the intervals cover every key exactly once.
    """
    out: list[Bounds] = []
    prev: object = None
    for i, mx in enumerate(parent_max):
        hi = None if i == len(parent_max) - 1 else (prev if mx is None else mx)
        out.append((prev, hi))
        prev = hi
    return out


def align_parts(
    files: list[Path], key: str, intervals: list[Bounds], jobs: int, bar: Progress | None = None
) -> int:
    """Rewrite Parquet part files so part ``i`` holds exactly the rows whose ``key`` is in interval ``i``.

    Only parts that are not already aligned are rewritten, each from the files whose key range
    overlaps its interval; all are written to temporary files first and renamed at the end, since a
    part's rewrite reads its neighbours' original files. Returns the number of rewritten parts.
    """
    con = duckdb.connect()
    present = [str(f) for f in files if f.exists()]
    ktype = dict(describe(con, read_files("parquet", present[:1])))[key] if present else "BIGINT"
    by_path = dict(zip(present, parquet_stats(con, present, key, ktype), strict=True))
    stats = [by_path.get(str(f), (0, None, None)) for f in files]
    con.close()

    def overlaps(s: tuple[int, Any, Any], b: Bounds) -> bool:
        n, mn, mx = s
        return n > 0 and (b[0] is None or mx > b[0]) and (b[1] is None or mn <= b[1])

    work: list[tuple[int, list[str]]] = []
    for i, b in enumerate(intervals):
        sources = [j for j, s in enumerate(stats) if overlaps(s, b)]
        own_inside = stats[i][0] == 0 or (
            (b[0] is None or stats[i][1] > b[0]) and (b[1] is None or stats[i][2] <= b[1])
        )
        if any(j != i for j in sources) or not own_inside:
            # With no source, the part becomes empty: filter its own file down to nothing.
            work.append((i, [str(files[j]) for j in sources] or [str(files[i])]))
    if not work:
        return 0

    threads = max(1, _cores() // max(1, min(jobs, len(work))))

    def rewrite(i: int, sources: list[str]) -> Callable[[], None]:
        def run() -> None:
            tmp = files[i].with_name(f".{files[i].name}.aligning")
            with duckdb.connect(config={"threads": threads}) as c:
                # Insertion order is kept (DuckDB's default), so rows stay sorted by key as generated.
                c.execute(
                    f"COPY (SELECT * FROM {read_files('parquet', sources)} "
                    f"WHERE {_interval_sql(key, intervals[i])}) TO {sql_literal(str(tmp))} (FORMAT parquet)"
                )

        return run

    tasks = [rewrite(i, src) for i, src in work]
    if bar is None:
        with _progress(False) as quiet:
            _run_parallel(tasks, jobs, quiet, "")
    else:
        _run_parallel(tasks, jobs, bar, f"aligning {files[0].parent.name}")
    tmps = [files[i].with_name(f".{files[i].name}.aligning") for i, _ in work]
    # Every file read belongs to a rewritten part (a file straddling into a neighbour's interval is
    # not aligned itself), so the rewritten parts must hold as many rows as before.
    before = sum(stats[i][0] for i, _ in work)
    with duckdb.connect() as c:
        after = sum(s[0] for s in parquet_stats(c, [str(t) for t in tmps]))
    if after != before:
        for t in tmps:
            t.unlink(missing_ok=True)
        raise DuckflockError(f"aligning {files[0].parent.name} changed {before} rows into {after}")
    for (i, _), tmp in zip(work, tmps, strict=True):
        os.replace(tmp, files[i])
    return len(work)


def _with_widths(catalog: Catalog) -> Catalog:
    """The catalog with string widths measured where a catalog written before they were lacks them
    (saved when that changed anything and the directory is writable: they are only estimates)."""
    stale = [t for t in TABLES if not catalog.table(t).widths]
    if not stale:
        return catalog
    with duckdb.connect() as con:
        measured = [with_widths(con, catalog.table(t), catalog.root) for t in stale]
    if any(info.widths for info in measured):
        for info in measured:
            catalog.put(info)
        with contextlib.suppress(OSError):
            catalog.save()
    return catalog


def _table_info(con: duckdb.DuckDBPyConnection, out: Path, table: str, parts: int) -> TableInfo:
    key = RANGE_KEYS.get(table)
    numbers: list[int | None] = [None] if key is None else list(range(1, parts + 1))
    files = [part_file(out, table, i) for i in numbers]
    present = [str(f) for f in files if f.exists()]
    if not present:
        raise DuckflockError(f"tpchgen wrote no file for table {table} in {out}")
    columns = describe(con, read_files("parquet", present[:1]))
    stats = dict(zip(present, parquet_stats(con, present, key, dict(columns).get(key or "")), strict=True))
    partitions = tuple(
        PartitionInfo((f.relative_to(out).as_posix(),), *stats[str(f)])
        if str(f) in stats
        else PartitionInfo((), 0)
        for f in files
    )
    if key is None:
        return with_widths(con, TableInfo(table, "parquet", columns, partitions, hive=()), out)
    return with_widths(con, TableInfo(table, "parquet", columns, partitions, "range", (key,), hive=()), out)


def _complete(catalog: Catalog) -> bool:
    return all(
        t in catalog.tables
        and all((catalog.root / f).is_file() for p in catalog.tables[t].partitions for f in p.files)
        for t in TABLES
    )


def _remove_old(out: Path) -> None:
    """Delete earlier TPC-H output (another part count leaves files this run would not overwrite)."""
    for t in TABLES:
        d = out / t
        if not d.is_dir():
            continue
        for f in d.iterdir():
            stem = f.name.removeprefix(".").removesuffix(".aligning")
            if stem == f"{t}.parquet" or (
                stem.startswith(f"{t}.") and stem.removeprefix(f"{t}.").removesuffix(".parquet").isdigit()
            ):
                f.unlink()


def generate_tpch(
    sf: float, out: str | os.PathLike[str], parts: int = 12, jobs: int | None = None, progress: bool = True
) -> Catalog:
    """Generate TPC-H at scale factor ``sf`` as Parquet into ``out`` and record it in its catalog.

    Each table except nation and region is written as ``parts`` range partitions, generated by one
    tpchgen-cli process per part, ``jobs`` (default: all cores) at a time. lineitem and
    partsupp are then aligned with orders and part (see the module docstring). If ``out`` already
    holds a complete TPC-H catalog of the same ``sf`` and ``parts``, nothing is generated. Other
    tables in the catalog are kept.
    """
    if sf <= 0:
        raise DuckflockError(f"the scale factor must be positive, not {sf}")
    if parts < 1:
        raise DuckflockError(f"the number of parts must be at least 1, not {parts}")
    out = Path(out).resolve()
    jobs = max(1, jobs or _cores())
    want = {"sf": float(sf), "parts": int(parts)}
    catalog = Catalog.open_or_create(out)
    if catalog.meta.get("tpch") == want and _complete(catalog):
        return _with_widths(catalog)

    # Forget the old tables before deleting their files, so the catalog never points at missing files.
    for t in TABLES:
        catalog.tables.pop(t, None)
    catalog.meta.pop("tpch", None)
    catalog.save()
    _remove_old(out)

    with _progress(progress) as bar:
        _generate(sf, out, parts, jobs, bar)
        with duckdb.connect() as con:
            parents = {p: _table_info(con, out, p, parts) for p in ALIGNED.values()}
        for child, parent in ALIGNED.items():
            intervals = parent_intervals([p.max for p in parents[parent].partitions])
            files = [part_file(out, child, i) for i in range(1, parts + 1)]
            align_parts(files, RANGE_KEYS[child], intervals, jobs, bar)
        with duckdb.connect() as con:
            for t in TABLES:
                catalog.put(_table_info(con, out, t, parts))
    catalog.meta["tpch"] = want
    catalog.save()
    return catalog
