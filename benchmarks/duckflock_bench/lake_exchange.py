"""``bench lake``'s exchange section: the seed join and the 22 TPC-H queries over the objects with
ranks exchanging through storage (a directory, and the bucket) vs MPI and threads, and the seed
join and Q9 over Flight workers too. Each transport has its own session; per query a checked
warm-up, then the median of ``runs``. For the bucket, the requests each query made on the exchange
prefix, counted from moto's log (objects: message objects written; deletes of objects read may
trail into the next query's count)."""

from __future__ import annotations

import collections
import contextlib
import re
import shutil
from pathlib import Path

import duckflock
from duckflock.testing.compare import difference
from duckflock.testing.tpch import ORDER, SEED_ORDER, SEED_QUERY, queries
from duckflock.testing.workers import FlightWorkers
from duckflock_bench.jobs import err
from duckflock_bench.lake_store import new_lines
from duckflock_bench.measure import median, timed

FLIGHT_QUERIES = ("seed", "Q9")  # the comparison with Flight workers
# A request line of moto's log: method and path (LIST is a GET of the bucket with a prefix).
_REQUEST = re.compile(r"(GET|PUT|POST|DELETE|HEAD) (/\S*) HTTP")  # may follow a colour code
_MESSAGE = re.compile(r"/msg/\d+-\d+-[0-9a-f]+$")


class RequestLog:
    """Counts the requests moto logged on a key prefix since the previous count."""

    def __init__(self, log: Path, bucket: str, prefix: str):
        self.log, self.bucket, self.prefix = log, bucket, prefix
        self.offset = log.stat().st_size

    def since_last(self) -> dict[str, int]:
        lines, self.offset = new_lines(self.log, self.offset)
        counts: collections.Counter[str] = collections.Counter()
        for method, path in _REQUEST.findall("\n".join(lines)):
            if path.startswith(f"/{self.bucket}?") and f"prefix={self.prefix}" in path:
                counts["LIST"] += 1
            elif path.startswith(f"/{self.bucket}/{self.prefix}"):
                counts[method] += 1
                counts["objects"] += method == "PUT" and bool(_MESSAGE.search(path.partition("?")[0]))
        counts["requests"] = sum(v for k, v in counts.items() if k != "objects")
        return dict(counts)


def run_exchange(
    s3_cat: Path, n_ranks: int, runs: int, baseline, work: Path, bucket: str, log: Path | None, only
) -> list[dict]:
    """Each query per transport; through the bucket only on moto (``log``: its request log): the
    ranks' streamed heartbeat uploads reach gofakes3 without a Content-Length, which it refuses."""
    qs = {f"Q{n}": (q, ORDER.get(n)) for n, q in queries().items() if not only or n in only}
    work_queries = {"seed": (SEED_QUERY, SEED_ORDER), **qs}
    err.print(f"[bold]exchange: {len(work_queries)} queries over objects, {n_ranks} ranks, by transport[/]")
    wants = {name: baseline.sql(q).to_arrow_table() for name, (q, _) in work_queries.items()}
    exchange_dir = work / "exchange"
    prefix = "exchange"
    # No query answered by DuckDB on the driver: every one runs as a distributed plan.
    config = {"driver_fallback_bytes": 0}
    transports: list[tuple[str, dict]] = [
        ("mpi", {}),
        ("threads", {}),
        ("storage (directory)", {"exchange_uri": str(exchange_dir)}),
        ("storage (bucket)", {"exchange_uri": f"s3://{bucket}/{prefix}"}),
        ("flight", {}),
    ]
    if log is None:
        transports = [t for t in transports if "bucket" not in t[0]]
    points: list[dict] = []
    for label, extra in transports:
        names = [n for n in work_queries if label != "flight" or n in FLIGHT_QUERIES]
        shutil.rmtree(exchange_dir, ignore_errors=True)
        with contextlib.ExitStack() as stack:
            if label == "flight":
                workers = stack.enter_context(
                    FlightWorkers(s3_cat, [("127.0.0.1", [])] * n_ranks, work / "workers")
                )
                db = duckflock.connect(workers=workers.addresses, token=workers.token, config=config)
            else:
                kind = label.partition(" ")[0]
                db = duckflock.connect(str(s3_cat), ranks=n_ranks, transport=kind, config={**config, **extra})
            stack.enter_context(db)
            requests = RequestLog(log, bucket, prefix) if log is not None and "bucket" in label else None
            for name in names:
                q, order = work_queries[name]
                points.append(_point(db, label, name, q, order, wants[name], runs, requests))
    return points


def _point(db, label: str, name: str, q: str, order, want, runs: int, requests: RequestLog | None) -> dict:
    """One query over one transport: a checked warm-up (its requests counted), then ``runs``."""
    if requests:
        requests.since_last()
    problem = difference(db.sql(q).arrow(), want, order)
    counts = requests.since_last() if requests else {}
    times = [timed(lambda: db.sql(q).arrow())[0] for _ in range(runs)]
    point = {"transport": label, "query": name, "s": median(times), "correct": problem is None}
    point.update(problem=problem, **counts)
    mark = " ok" if problem is None else f" WRONG: {problem}"
    extra = f", {counts['objects']} objects, {counts['requests']} requests" if counts else ""
    err.print(f"  {name} over {label}: {point['s']:.3f} s{extra}{mark}", highlight=False)
    return point


def exchange_markdown(points: list[dict]) -> list[str]:
    """One row per query: its time per transport, the storage exchange's and Flight's ratio to MPI,
    and the bucket's objects and requests; then the 22's sums."""
    by = {(p["query"], p["transport"]): p for p in points}
    names = list(dict.fromkeys(p["query"] for p in points))
    cols = ["mpi", "threads", "flight", "storage (directory)", "storage (bucket)"]
    lines = [
        "## The exchange by transport, over the objects",
        "",
        "Seconds (median; Flight's time over MPI's in parentheses), the storage exchange's time over "
        "MPI's, and per query the "
        "message objects the bucket's exchange wrote and all its requests (heartbeats and listings "
        "included). Flight workers run the seed join and Q9 only.",
        "",
        "| query | MPI | threads | Flight | directory | dir/MPI | bucket | bucket/MPI | objects | requests "
        "| correct |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]

    def row(name: str, s: dict[str, float], bucket: dict, ok: bool) -> str:
        t = [f"{s[c]:.3f}" if c in s else "-" for c in cols]
        ratio = [f"{s[c] / s['mpi']:.2f}x" if c in s and s.get("mpi") else "-" for c in cols[2:]]
        flight = f"{t[2]} ({ratio[0]})" if "flight" in s else "-"
        return (
            f"| {name} | {t[0]} | {t[1]} | {flight} | {t[3]} | {ratio[1]} | {t[4]} | {ratio[2]} "
            f"| {bucket.get('objects', '-')} | {bucket.get('requests', '-')} | {'yes' if ok else 'NO'} |"
        )

    for name in names:
        pts = {c: by[name, c] for c in cols if (name, c) in by}
        seconds = {c: p["s"] for c, p in pts.items()}
        ok = all(p["correct"] for p in pts.values())
        lines.append(row(name, seconds, pts.get("storage (bucket)", {}), ok))
    tpch = [n for n in names if n.startswith("Q")]
    if len(tpch) > 1:
        sums = {c: sum(by[n, c]["s"] for n in tpch) for c in cols if all((n, c) in by for n in tpch)}
        bucket = [by[n, "storage (bucket)"] for n in tpch if (n, "storage (bucket)") in by]
        totals = {k: sum(p.get(k, 0) for p in bucket) for k in ("objects", "requests")} if bucket else {}
        ok = all(p["correct"] for p in points if p["query"] in tpch)
        lines.append(row(f"**{len(tpch)} TPC-H, summed**", sums, totals, ok))
    lines.append("")
    return lines
