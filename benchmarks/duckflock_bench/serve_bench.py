"""``duckflock bench serve``: the 22 TPC-H queries through ``duckflock serve`` (Arrow Flight SQL, read
by ADBC's Flight SQL driver, as a client program would) vs the same session in-process
(``Session.sql(...).arrow()``), on the same warm ranks. The two are run alternately, in a rotating
order, so that noise on this machine hits them alike; every ADBC result is checked against
single-process DuckDB. Reported per query and summed (the goal: ADBC within 1.1x of in-process);
timings are never judged. Exit code non-zero only when a query failed or gave a wrong result.
Then a large result read from an endpoint per rank vs one endpoint (serve_large.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from duckflock.errors import DuckflockError
from duckflock.flightsql.server import FlightSqlServer, open_session
from duckflock.testing.compare import same_result
from duckflock.testing.tables import oracle
from duckflock.testing.tpch import ORDER, queries
from duckflock_bench.flight_common import ensure_data, first_line, header
from duckflock_bench.jobs import write_json
from duckflock_bench.measure import machine_info, median, parse_list, timed, versions
from duckflock_bench.report import print_markdown
from duckflock_bench.serve_large import markdown as large_markdown
from duckflock_bench.serve_large import measure as measure_large

SERVE_TARGET = 1.1  # the issue's goal for the 22 summed


def run(args: argparse.Namespace) -> int:
    import adbc_driver_flightsql.dbapi as flightsql

    if args.runs < 1:
        raise DuckflockError("--runs must be at least 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = ensure_data(Path(args.data_root), args.sf)
    only = [] if args.large_only else parse_list(args.queries, int) if args.queries else sorted(queries())
    ref = oracle(data)
    rows, errors = [], []
    large = None
    with open_session(str(data), args.ranks) as session:
        server = FlightSqlServer("grpc+tcp://127.0.0.1:0", session)
        try:
            with flightsql.connect(f"grpc://127.0.0.1:{server.port}", autocommit=True) as conn:
                cur = conn.cursor()

                def through_adbc(sql: str):
                    cur.execute(sql)
                    return cur.fetch_arrow_table()

                for n in only:
                    sql = queries()[n]
                    try:
                        rows.append(_measure(n, sql, args.runs, session, through_adbc, ref))
                    except Exception as e:  # reported, and the next query runs
                        errors.append(f"Q{n}: {first_line(e)}")
                    print(f"Q{n} done", flush=True)
        finally:
            server.stop()
        if args.large_rows > 0:
            large = measure_large(session, data, args.large_rows, max(1, args.large_runs))
    results = {**_summary(args, rows, errors), "large": large}
    write_json(out / "results.json", results)
    markdown = _markdown(results)
    (out / "results.md").write_text(markdown)
    print_markdown(markdown)
    large_ok = large is None or all(w["correct"] for w in large["ways"].values())
    return 1 if errors or not large_ok or not all(r["correct"] for r in rows) else 0


def _measure(n: int, sql: str, runs: int, session, through_adbc, ref) -> dict:
    in_process, adbc = [], []
    got = None
    for i in range(runs + 1):  # the first of each is a warm-up
        pair = [("in", lambda: session.sql(sql).arrow()), ("adbc", lambda: through_adbc(sql))]
        for name, fn in pair if i % 2 == 0 else pair[::-1]:
            seconds, table = timed(fn)
            if i:
                (in_process if name == "in" else adbc).append(seconds)
            if name == "adbc":
                got = table
    correct = same_result(got, ref.sql(sql).to_arrow_table(), ORDER.get(n))
    return {
        "query": n,
        "in_process_s": median(in_process),
        "adbc_s": median(adbc),
        "rows": got.num_rows,
        "correct": correct,
    }


def _summary(args: argparse.Namespace, rows: list[dict], errors: list[str]) -> dict:
    in_total = sum(r["in_process_s"] for r in rows)
    adbc_total = sum(r["adbc_s"] for r in rows)
    return {
        "sf": args.sf,
        "ranks": args.ranks,
        "runs": args.runs,
        "machine": machine_info(memcpy=False),
        "versions": versions(with_mpi=False),
        "queries": rows,
        "in_process_total_s": in_total,
        "adbc_total_s": adbc_total,
        "ratio": adbc_total / in_total if in_total else float("nan"),
        "target": SERVE_TARGET,
        "errors": errors,
    }


def _markdown(r: dict) -> str:
    lines = [
        f"# duckflock serve: TPC-H SF {r['sf']} through ADBC, {r['ranks']} ranks (threads)",
        "",
        *header(r["machine"], r["versions"]),
    ]
    if r["queries"]:
        lines += _tpch_markdown(r)
    lines += [f"- error: {e}" for e in r["errors"]]
    if r["large"] is not None:
        lines += large_markdown(r["large"], r["ranks"])
    return "\n".join(lines) + "\n"


def _tpch_markdown(r: dict) -> list[str]:
    lines = [
        "The 22 queries through ADBC vs in-process. "
        f"Median of {r['runs']} runs after a warm-up; every ADBC result checked against DuckDB.",
        "",
        "| query | in-process s | ADBC s | ratio | rows | correct |",
        "|---|---|---|---|---|---|",
    ]
    for q in r["queries"]:
        ratio = q["adbc_s"] / q["in_process_s"] if q["in_process_s"] else float("nan")
        lines.append(
            f"| Q{q['query']} | {q['in_process_s']:.3f} | {q['adbc_s']:.3f} | {ratio:.2f} | {q['rows']} "
            f"| {'yes' if q['correct'] else '**NO**'} |"
        )
    lines += [
        "",
        f"Sum: in-process {r['in_process_total_s']:.3f} s, ADBC {r['adbc_total_s']:.3f} s: "
        f"**{r['ratio']:.3f}x** (goal at most {r['target']}x).",
    ]
    return lines
