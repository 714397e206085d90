"""Smoke tests of `duckflock bench`: tiny sizes, real MPI jobs. They check that the benchmarks run
and write sane results — never how fast anything was."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist


def bench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "duckflock.cli.main", "bench", *args],
        cwd=cwd,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def positive(x: object) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def test_bench_exchange_smoke(tmp_path):
    out = tmp_path / "exchange"
    bench("exchange", "--ranks", "2", "--gb", "0.02", "--runs", "1", "--out", str(out), cwd=tmp_path)
    results = json.loads((out / "results.json").read_text())
    assert not results["errors"]
    [point] = results["points"]
    assert point["ranks"] == 2
    assert point["correct"] is True
    for key in (
        "gbps_median",
        "memcpy_gbps",
        "mpi_p2p_gbps",
        "input_gb",
        "wall_median_s",
        "peak_rss_kb_sum",
        "cpu_busy_median",
        "split_only_gbps",
    ):
        assert positive(point[key]), (key, point[key])
    assert (out / "results.md").is_file()
    assert (out / "exchange_gbps.png").stat().st_size > 0


def test_bench_seed_smoke(tmp_path):
    out = tmp_path / "seed"
    bench(
        "seed",
        *("--sf", "0.01", "--ranks", "2", "--runs", "1"),
        *("--data-root", str(tmp_path), "--out", str(out)),
        cwd=tmp_path,
    )
    results = json.loads((out / "results.json").read_text())
    assert not results["errors"]
    [entry] = results["scale_factors"]
    [point] = entry["points"]
    assert point["ranks"] == 2
    assert point["correct"] is True
    assert point["rows"] > 0
    for key in (
        "duckflock_median_s",
        "duckdb_median_s",
        "bytes_exchanged",
        "peak_rss_kb_sum",
        "duckdb_peak_rss_kb",
        "node_memory_kb",
    ):
        assert positive(point[key]), (key, point[key])
    assert len(point["peak_rss_kb_per_rank"]) == 2
    # Shared-library pages counted once can only lower the figure.
    assert point["node_memory_kb"] <= point["peak_rss_kb_sum"]
    assert positive(results["machine"]["memcpy_gbps"])
    assert "mpi" in results["versions"]
    assert (out / "results.md").is_file()
    for png in ("seed_phases.png", "seed_vs_duckdb.png", "seed_exchange.png"):
        assert (out / png).stat().st_size > 0


def test_pss_meter_counts_a_tree_and_its_shared_pages_once(tmp_path):
    """Two children each touching 64 MiB of their own: the tree's peak holds both at once, and
    with the three interpreters' pages (libraries shared among them) it stays well under 3x."""
    from duckflock_bench import pss

    if pss.available() is not None:
        pytest.skip(pss.available())
    child = "b = bytearray(64 << 20); import time; time.sleep(1.0)"
    script = (
        "import subprocess, sys\n"
        f"ps = [subprocess.Popen([sys.executable, '-c', {child!r}]) for _ in range(2)]\n"
        "[p.wait() for p in ps]\n"
    )
    m = pss.run_sampled([sys.executable, "-c", script], tmp_path, os.environ.copy(), timeout=60)
    assert m.returncode == 0, m.stderr
    assert m.peak_pss_bytes >= 2 * (64 << 20)
    assert m.peak_rank_pss_bytes == 0  # no process loaded DuckDB
    assert m.peak_pss_bytes < 3 * (64 << 20) + (200 << 20)


def test_bench_lake_smoke(tmp_path):
    out = tmp_path / "lake"
    bench(
        "lake",
        *("--sf", "0.01", "--ranks", "2", "--queries", "6", "--sections", "tpch,pushdown", "--store", "moto"),
        *("--data-root", str(tmp_path), "--out", str(out)),
        cwd=tmp_path,
    )
    results = json.loads((out / "results.json").read_text())
    [point] = results["tpch"]
    assert point["correct"] and positive(point["s3_s"]) and positive(point["local_s"])
    store = results["store"]
    assert (
        store["name"] == "moto" and positive(store["whole_get_mb_s"]) and positive(store["range_64kb_get_ms"])
    )
    assert positive(results["upload"]["bytes"])
    pushdown = results["pushdown"]
    assert [q["query"] for q in pushdown["queries"]] == [1, 6, 14]
    assert all(positive(q["fetched"]) and positive(q["referenced_bytes"]) for q in pushdown["queries"])
    assert pushdown["sorted"]["correct"]
    assert (out / "results.md").is_file()
    for png in ("lake_tpch_ratio.png", "lake_pushdown_bytes.png"):
        assert (out / png).stat().st_size > 0


def test_lake_exchange_counts_the_requests_on_its_prefix(tmp_path):
    from duckflock_bench.lake_exchange import RequestLog

    log = tmp_path / "moto.log"
    log.write_text('127.0.0.1 - - [x] "PUT /lake/tpch/a.parquet HTTP/1.1" 200 -\n')
    requests = RequestLog(log, "lake", "exchange")
    with open(log, "a") as f:
        f.write(
            '127.0.0.1 - - [x] "PUT /lake/exchange/j/msg/0-000000000003-2 HTTP/1.1" 200 -\n'
            '127.0.0.1 - - [x] "PUT /lake/exchange/j/msg/ HTTP/1.1" 200 -\n'
            '127.0.0.1 - - [x] "GET /lake?list-type=2&prefix=exchange/j/msg/ HTTP/1.1" 200 -\n'
            '127.0.0.1 - - [x] "\x1b[35mGET /lake/exchange/j/msg/1-000000000000-1 HTTP/1.1\x1b[0m" 206 -\n'
            '127.0.0.1 - - [x] "GET /lake/tpch/a.parquet HTTP/1.1" 206 -\n'
        )
    assert requests.since_last() == {"PUT": 2, "objects": 1, "LIST": 1, "GET": 1, "requests": 4}
    assert requests.since_last() == {"requests": 0}


def test_bench_scaling_smoke(tmp_path):
    out = tmp_path / "scaling"
    ranks = "2" if len(os.sched_getaffinity(0)) >= 2 else "1"
    bench(
        "scaling",
        *("--sf", "0.01", "--ranks", ranks, "--runs", "1", "--queries", "6"),
        *("--data-root", str(tmp_path), "--out", str(out)),
        cwd=tmp_path,
    )
    results = json.loads((out / "results.json").read_text())
    assert [p["ranks"] for p in results["points"]] == [int(r) for r in ranks.split(",")]
    for point in results["points"]:
        assert point["correct"] and positive(point["speedup"]) and positive(point["duckdb_1core_s"])
    assert (out / "results.md").is_file() and (out / "scaling_efficiency.png").stat().st_size > 0


@pytest.mark.slow
def test_bench_model_smoke(tmp_path):
    """calibrate, validate on 2 ranks at SF 0.01, project: files written, numbers positive."""
    out, docs = tmp_path / "model", tmp_path / "docs"
    common = ("--data-root", str(tmp_path), "--out", str(out), "--docs", str(docs))
    constants = ("--constants", str(tmp_path / "calibrate" / "constants.json"))
    calibrate = ("--rows", "200000", "--ranks", "2", "--out", str(tmp_path / "calibrate"))
    bench("calibrate", "--data-root", str(tmp_path), *calibrate, cwd=tmp_path)
    bench("model", "--validate", "--sf", "0.01", "--ranks", "2", "--queries", "q6,q9", "--runs", "1",
          *constants, *common, cwd=tmp_path)  # fmt: skip
    project = ("--nodes", "16,256", "--network", "25Gbit/s", "--sf", "10")
    bench("model", *project, *constants, *common, cwd=tmp_path)
    calibration = json.loads((tmp_path / "calibrate" / "constants.json").read_text())
    assert all(positive(v) for k, v in calibration["constants"].items() if not k.startswith("overhead"))
    validation = json.loads((out / "validation.json").read_text())
    assert [(p["query"], p["ranks"]) for p in validation["points"]] == [("q6", 2), ("q9", 2)]
    for p in validation["points"]:
        assert positive(p["measured"]["total"]) and positive(p["predicted"]["total"]) and positive(p["busy"])
        assert positive(p["predicted"]["compute"])
    projection = json.loads((out / "projection.json").read_text())
    assert {p["nodes"] for p in projection["points"]} == {1, 16, 256}
    assert all(positive(p["phases"]["total"]) and positive(p["speedup"]) for p in projection["points"])
    for name in ("model_validation.png", "model_speedup.png", "model_phases.png"):
        assert (docs / name).stat().st_size > 0
    assert (out / "validation.md").is_file() and (out / "projection.md").is_file()


def test_bench_serve_smoke(tmp_path):
    out = tmp_path / "serve"
    args = ["serve", "--sf", "0.01", "--queries", "6", "--runs", "1", "--large-rows", "200000"]
    bench(*args, "--large-runs", "1", "--data-root", str(tmp_path / "data"), "--out", str(out), cwd=tmp_path)
    results = json.loads((out / "results.json").read_text())
    assert not results["errors"] and [q["correct"] for q in results["queries"]] == [True]
    large = results["large"]
    assert positive(large["memcpy_gbps"])
    assert set(large["ways"]) == {
        "per-rank endpoints",
        "per-rank endpoints, a reader per part",
        "one endpoint",
    }
    for way in large["ways"].values():
        assert way["correct"] is True and way["rows"] >= 200_000
        assert all(positive(way[k]) for k in ("bytes", "execute_s", "fetch_s", "fetch_gbps"))
