"""``duckflock bench lake``: TPC-H registered in place on S3-compatible storage (gofakes3 or moto's
server on loopback, started here: lake_store.py) against the same files on local disk, in one run:

* tpch: the 22 queries over objects vs over local files (both registered in place, so the plans
  are the same), every result checked against DuckDB; the store's own GET throughput and request
  latency measured alongside, since on loopback the store, not the network, is the ceiling.
* pushdown: bytes fetched (exec/stages/scan_stats.py, from a profiled run) by Q1, Q6 and Q14 against a
  scan of every column of the tables they read (no projection or filter to push), and against
  the compressed bytes of the columns they reference (Parquet footers); then Q6 over a lineitem
  written sorted by l_shipdate, whose row groups outside Q6's year DuckDB skips.
* exchange: the seed join and the 22 over the objects with ranks exchanging through storage (a
  directory, and the bucket) vs MPI and threads, and the seed join and Q9 over Flight workers
  (lake_exchange.py).
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

import duckflock
from duckflock.catalog import Catalog
from duckflock.exec.reports import ScanStats, summed
from duckflock.ingest.tpch import generate_tpch
from duckflock.plan.sql_text import read_table_files
from duckflock.storage import objects
from duckflock.testing.compare import difference
from duckflock.testing.tables import oracle
from duckflock.testing.tpch import ORDER, queries
from duckflock_bench import lake_s3, lake_store
from duckflock_bench.jobs import err, write_json
from duckflock_bench.lake_exchange import run_exchange
from duckflock_bench.lake_report import requests_text
from duckflock_bench.measure import cores, machine_info, median, timed, versions
from duckflock_bench.proc_cpu import cpu_seconds

BUCKET = "lake"
# The columns each pushdown query references, by table (what an ideal scan reads).
REFERENCED = {
    1: {
        "lineitem": [
            "l_returnflag",
            "l_linestatus",
            "l_quantity",
            "l_extendedprice",
            "l_discount",
            "l_tax",
            "l_shipdate",
        ]
    },
    6: {"lineitem": ["l_shipdate", "l_discount", "l_quantity", "l_extendedprice"]},
    14: {
        "lineitem": ["l_partkey", "l_extendedprice", "l_discount", "l_shipdate"],
        "part": ["p_partkey", "p_type"],
    },
}
SECTIONS = ("tpch", "pushdown", "exchange")


def run_lake(
    sf: float,
    ranks: list[int],
    runs: int,
    data_root: str,
    out: Path,
    only: list[int] | None = None,
    sections: tuple[str, ...] = SECTIONS,
    store: str | None = None,
) -> dict:
    parts = max(12, math.ceil(12 * sf))  # lineitem files of ~20 MB at any scale factor
    data = Path(data_root) / f"tpch-sf{sf:g}" if parts == 12 else Path(data_root) / f"tpch-sf{sf:g}-p{parts}"
    generate_tpch(sf, data, parts=parts, progress=True)
    catalog = Catalog.load(data)
    work = out / "catalogs"
    shutil.rmtree(work, ignore_errors=True)
    local_cat, s3_cat = work / "local", work / "s3"
    files = {
        t: [Path(catalog.path(f)) for p in info.partitions for f in p.files]
        for t, info in catalog.tables.items()
    }
    results: dict = {
        "benchmark": "lake",
        "sf": sf,
        "runs": runs,
        "ranks": ranks,
        "machine": machine_info(memcpy=False),
        "versions": versions(with_mpi=False),
    }
    t_start = time.perf_counter()
    store = lake_store.choose(store)
    with lake_s3.s3(store, out) as server:
        results["endpoint"] = server.endpoint
        lake_s3.create_bucket(server.endpoint, BUCKET)
        size, seconds, biggest = 0, 0.0, ("", 0)
        for table, paths in files.items():
            uris, n, s = lake_s3.upload_files(paths, f"s3://{BUCKET}/tpch/{table}")
            size, seconds = size + n, seconds + s
            biggest = max(
                [biggest, *zip(uris, (p.stat().st_size for p in paths), strict=True)], key=lambda x: x[1]
            )
            lake_s3.register(local_cat, table, [str(p) for p in paths])
            lake_s3.register(s3_cat, table, uris)
        results["upload"] = {
            "bytes": size,
            "s": seconds,
            "mb_per_s": size / seconds / 1e6,
            "objects": sum(map(len, files.values())),
        }
        results["largest_object"] = {"uri": biggest[0], "bytes": biggest[1]}
        results["store"] = {"name": store, **lake_store.describe(store), **lake_s3.throughput(biggest[0])}
        st = results["store"]
        err.print(
            f"{store}: uploaded {size / 1e6:.0f} MB in {seconds:.1f} s ({size / seconds / 1e6:.0f} MB/s); "
            f"GET of {biggest[1] / 1e6:.0f} MB: {st['whole_get_mb_s']:.0f} MB/s, 4 MB ranges "
            f"{st['range_4mb_get_mb_s']:.0f} MB/s, a 64 KB range {st['range_64kb_get_ms']:.1f} ms",
            highlight=False,
        )
        baseline = oracle(data, cores())
        if "tpch" in sections:
            port = server.endpoint.rsplit(":", 1)[1]
            cpu = {"s3": str(s3_cat), "local": str(local_cat), "server": f"127.0.0.1:{port}"}
            results["tpch"] = _tpch(local_cat, s3_cat, ranks, runs, baseline, only, server.requests, cpu)
            _duckdb_alone(results["tpch"], s3_cat, runs, baseline, server.requests)
        if "pushdown" in sections:
            results["pushdown"] = _pushdown(s3_cat, files, max(ranks), baseline, work)
        if "exchange" in sections:
            results["exchange"] = run_exchange(
                s3_cat, max(ranks), runs, baseline, work, BUCKET, server.moto_log, only
            )
    results["wall_s"] = time.perf_counter() - t_start
    return results


def _check(got: Any, want: pa.Table, order: list[str] | None) -> str | None:
    """What differs between a duckflock result and DuckDB's, or None."""
    return difference(got.arrow(), want, order)


def _counted(log: lake_store.RequestLog, run: Any) -> tuple[float, dict[str, int] | None]:
    """Seconds of ``run()`` and the store's requests meanwhile, by kind (None: not counted)."""
    before = log.counts()
    seconds = timed(run)[0]
    after = log.counts()
    if before is None or after is None:
        return seconds, None
    return seconds, {k: after[k] - before[k] for k in after}


def _requests_text(counts: dict[str, int] | None) -> str:
    return "" if counts is None else f"; {requests_text(counts)}"


def _tpch(
    local_cat: Path,
    s3_cat: Path,
    ranks: list[int],
    runs: int,
    baseline,
    only: list[int] | None,
    log: lake_store.RequestLog,
    cpu: dict[str, str],
) -> list[dict]:
    """Per query: seconds over objects and over local files, and the CPU seconds meanwhile of the
    ranks of each and of the S3 server (``cpu``: what their command lines hold): the server's
    CPU is taken from the cores the ranks use."""
    points = []
    qs = {n: q for n, q in queries().items() if not only or n in only}
    for n_ranks in ranks:
        err.print(f"[bold]tpch: {n_ranks} ranks, objects vs local files[/]")
        with (
            duckflock.connect(str(s3_cat), ranks=n_ranks) as s3,
            duckflock.connect(str(local_cat), ranks=n_ranks) as local,
        ):
            for n, q in qs.items():
                want = baseline.sql(q).to_arrow_table()
                problems = [_check(db.sql(q), want, ORDER.get(n)) for db in (s3, local)]  # also warms up
                on_s3, on_disk, requests = [], [], []
                used = dict.fromkeys(cpu, 0.0)
                for _ in range(runs):
                    before = {k: cpu_seconds(v) for k, v in cpu.items()}
                    on_disk.append(timed(lambda q=q: local.sql(q))[0])
                    middle = {k: cpu_seconds(v) for k, v in cpu.items()}
                    seconds, counted = _counted(log, lambda q=q: s3.sql(q))
                    after = {k: cpu_seconds(v) for k, v in cpu.items()}
                    on_s3.append(seconds)
                    requests.append(counted)
                    used["local"] += middle["local"] - before["local"]
                    for k in ("s3", "server"):
                        used[k] += after[k] - middle[k]
                point = {
                    "ranks": n_ranks,
                    "query": n,
                    "s3_s": median(on_s3),
                    "local_s": median(on_disk),
                    "ratio": median(on_s3) / median(on_disk),
                    "requests": requests[0],
                    "cpu_s3_s": used["s3"] / runs,
                    "cpu_server_s": used["server"] / runs,
                    "cpu_local_s": used["local"] / runs,
                    "correct": all(p is None for p in problems),
                    "problem": next((p for p in problems if p), None),
                }
                points.append(point)
                mark = " ok" if point["correct"] else f" WRONG: {point['problem']}"
                err.print(
                    f"  Q{n:02d}: S3 {point['s3_s']:.3f} s, local {point['local_s']:.3f} s "
                    f"({point['ratio']:.2f}x); CPU s: ranks {point['cpu_s3_s']:.2f} + server "
                    f"{point['cpu_server_s']:.2f} vs {point['cpu_local_s']:.2f}"
                    f"{_requests_text(point['requests'])}{mark}",
                    highlight=False,
                )
    return points


def _duckdb_over(catalog_dir: Path) -> tuple[duckdb.DuckDBPyConnection, list[objects.Stamp]]:
    """Single-process DuckDB (all cores) over a catalog's files, objects read through the same
    adapter the ranks use: how fast the store lets any DuckDB go. With the objects' stamps, to
    expect before each query as a rank's stage does (each object checked once a query)."""
    con = duckdb.connect(config={"threads": cores()})
    objects.register(con)
    catalog = Catalog.load(catalog_dir)
    for name, info in catalog.tables.items():
        paths = [catalog.path(f) for p in info.partitions for f in p.files]
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM {read_table_files(info, paths)}")
    return con, [objects.Stamp(*o) for info in catalog.tables.values() for o in info.objects]


def _duckdb_alone(
    points: list[dict],
    s3_cat: Path,
    runs: int,
    baseline: duckdb.DuckDBPyConnection,
    log: lake_store.RequestLog,
) -> None:
    """Each query by DuckDB alone over the objects and over the local files: the store's share of
    duckflock's ratio (the same adapter and store, no ranks)."""
    err.print("[bold]tpch: DuckDB alone, objects vs local files[/]")
    con, stamps = _duckdb_over(s3_cat)

    def run(q: str) -> pa.Table:
        objects.begin_query()
        objects.expect(stamps)
        return con.sql(q).to_arrow_table()

    qs = queries()
    for n in sorted({p["query"] for p in points}):
        q = qs[n]
        run(q)  # warm-up, as for duckflock
        counted = [_counted(log, lambda q=q: run(q)) for _ in range(runs)]
        on_s3 = [seconds for seconds, _ in counted]
        on_disk = [timed(lambda q=q: baseline.sql(q).to_arrow_table())[0] for _ in range(runs)]
        for p in points:
            if p["query"] == n:
                p.update(
                    duckdb_s3_s=median(on_s3), duckdb_local_s=median(on_disk), duckdb_requests=counted[0][1]
                )
                p["duckdb_ratio"] = p["duckdb_s3_s"] / p["duckdb_local_s"]
        err.print(
            f"  Q{n:02d}: S3 {median(on_s3):.3f} s, local {median(on_disk):.3f} s"
            + _requests_text(counted[0][1]),
            highlight=False,
        )
    con.close()


def _scans(db: duckflock.Session, query: str) -> tuple[float, list[ScanStats]]:
    result = db.sql(query, profile=True)
    return result.seconds, summed([s.scans for s in result.stats])


def _footer_bytes(paths: list[Path], columns: list[str] | None) -> int:
    """Compressed bytes of ``columns`` (all: None) in these Parquet files, footers included."""
    total = 0
    for path in paths:
        meta = pq.ParquetFile(path).metadata
        total += meta.serialized_size
        for i in range(meta.num_row_groups):
            rg = meta.row_group(i)
            for j in range(rg.num_columns):
                col = rg.column(j)
                if columns is None or col.path_in_schema in columns:
                    total += col.total_compressed_size
    return total


def _pushdown(s3_cat: Path, files: dict[str, list[Path]], n_ranks: int, baseline, work: Path) -> dict:
    out: dict = {"ranks": n_ranks, "queries": [], "unpushed": {}}
    qs = queries()
    err.print(f"[bold]pushdown: bytes fetched, {n_ranks} ranks[/]")
    with duckflock.connect(str(s3_cat), ranks=n_ranks) as db:
        for table in ("lineitem", "part"):
            names = [f.name for f in db.sql(f"SELECT * FROM {table} LIMIT 0").arrow().schema]
            concat = ", ".join(f"CAST({c} AS VARCHAR)" for c in names)
            seconds, scans = _scans(db, f"SELECT sum(length(concat_ws('|', {concat}))) AS w FROM {table}")
            out["unpushed"][table] = {"s": seconds, **_scan_dict(scans[0])}
        for n, by_table in REFERENCED.items():
            seconds, scans = _scans(db, qs[n])
            fetched = sum(s.bytes_fetched or 0 for s in scans)
            referenced = sum(_footer_bytes(files[t], cols) for t, cols in by_table.items())
            unpushed = sum(out["unpushed"][t]["bytes_fetched"] for t in by_table)
            point = {
                "query": n,
                "s": seconds,
                "fetched": fetched,
                "referenced_bytes": referenced,
                "unpushed_fetched": unpushed,
                "table_bytes": sum(s.bytes_total for s in scans),
                "vs_referenced": fetched / referenced,
                "scans": [_scan_dict(s) for s in scans],
            }
            out["queries"].append(point)
            err.print(
                f"  Q{n}: {fetched / 1e6:.1f} MB fetched; all columns {unpushed / 1e6:.1f} MB; "
                f"its columns {referenced / 1e6:.1f} MB ({point['vs_referenced']:.2f}x)",
                highlight=False,
            )
    out["sorted"] = _sorted_q6(files["lineitem"], n_ranks, baseline, work)
    return out


def _scan_dict(s: ScanStats) -> dict:
    return {**vars(s), "describe": s.describe()}


def _sorted_q6(lineitem: list[Path], n_ranks: int, baseline, work: Path) -> dict:
    """Q6 over lineitem written sorted by l_shipdate (objects of at most 24 MB): its row groups hold
    narrow date ranges, and DuckDB skips those outside Q6's year by their statistics."""
    local = work / "sorted-lineitem"
    shutil.rmtree(local, ignore_errors=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        con = duckdb.connect(config={"threads": cores(), "memory_limit": "1GB", "temp_directory": tmp})
        paths = ", ".join(f"'{p}'" for p in lineitem)
        con.execute(
            f"COPY (SELECT * FROM read_parquet([{paths}]) ORDER BY l_shipdate) TO '{local}' "
            "(FORMAT parquet, FILE_SIZE_BYTES '24MB', COMPRESSION zstd)"
        )
        con.close()
    written = sorted(local.glob("*.parquet"))
    write_s = time.perf_counter() - t0
    uris, _, upload_s = lake_s3.upload_files(written, f"s3://{BUCKET}/sorted/lineitem")
    cat = work / "s3-sorted"
    lake_s3.register(cat, "lineitem", uris)
    q6 = queries()[6]
    with duckflock.connect(str(cat), ranks=n_ranks) as db:
        problem = _check(db.sql(q6), baseline.sql(q6).to_arrow_table(), ORDER.get(6))
        seconds, scans = _scans(db, q6)
    s = scans[0]
    referenced = _footer_bytes(written, REFERENCED[6]["lineitem"])
    point = {
        "write_s": write_s,
        "upload_s": upload_s,
        "object_count": len(written),
        "s": seconds,
        "correct": problem is None,
        "problem": problem,
        "referenced_bytes": referenced,
        "vs_referenced": (s.bytes_fetched or 0) / referenced,
        **_scan_dict(s),
    }
    err.print(f"  Q6 over lineitem sorted by l_shipdate: {s.describe()}", highlight=False)
    return point


def run(
    args_sf: float, ranks: list[int], runs: int, data_root: str, out: Path, only, sections, store: str | None
) -> int:
    from duckflock_bench.lake_report import lake_figures, lake_markdown
    from duckflock_bench.report import print_markdown

    results = run_lake(args_sf, ranks, runs, data_root, out, only, sections, store)
    write_json(out / "results.json", results)
    md = lake_markdown(results)
    (out / "results.md").write_text(md)
    figures = lake_figures(results, out)
    print_markdown(md)
    err.print(f"wrote {out / 'results.json'}, {out / 'results.md'}, " + ", ".join(str(f) for f in figures))
    checked = [p["correct"] for p in results.get("tpch", []) + results.get("exchange", [])]
    if "pushdown" in results:
        checked.append(results["pushdown"]["sorted"]["correct"])
    return 0 if all(checked) else 1
