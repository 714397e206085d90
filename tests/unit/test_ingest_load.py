"""load_table on in-process groups of ranks: every rank in its own thread with its own runtime."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import duckdb
import pytest

from duckflock.catalog import Catalog, Hashed, Ranged, TableInfo
from duckflock.config import Config
from duckflock.errors import CatalogError, DuckflockError, ExecutionError
from duckflock.exec.resources.runtime import Runtime
from duckflock.ingest.load import load_table
from duckflock.plan.sql_text import read_files, read_table_files
from duckflock.transport.inproc import InProcTransport

QID = 7
ROWS = 5000


def run_ranks(n: int, body: Callable[[Runtime], object]) -> tuple[list[object], list[BaseException | None]]:
    """Run ``body`` on n ranks; like the real caller, a failing rank reports to the others."""
    transports = InProcTransport.group(n)
    results: list[object] = [None] * n
    errors: list[BaseException | None] = [None] * n
    done = threading.Barrier(n)

    def rank(r: int) -> None:
        rt = Runtime.create(transports[r], None, Config(threads=1), ranks_on_node=n)
        try:
            results[r] = body(rt)
        except Exception as e:
            errors[r] = e
            rt.mux.fail(QID, None, f"{type(e).__name__}: {e}")
        finally:
            # Keep every mux running until all ranks are done, so no message is lost.
            done.wait(timeout=60)
            rt.close()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a rank hangs"
    return results, errors


def load(n: int, root: Path, name: str, files: list[str], **kw) -> TableInfo:
    results, errors = run_ranks(n, lambda rt: load_table(rt, QID, root, name, files, **kw))
    assert errors == [None] * n
    assert results[1:] == [None] * (n - 1)
    info = results[0]
    assert isinstance(info, TableInfo)
    assert Catalog.load(root).table(name) == info
    return info


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, list[str]]:
    """Four Parquet files of different sizes: ints with duplicates, strings with NULLs, dates, doubles."""
    src = tmp_path_factory.mktemp("inputs")
    con = duckdb.connect()
    files = []
    for i, (lo, hi) in enumerate([(0, 2000), (2000, 2600), (2600, 4500), (4500, ROWS)]):
        f = src / f"in{i}.parquet"
        con.execute(
            f"COPY (SELECT range AS id, (range * 7919) % 613 AS k, "
            f"CASE WHEN range % 11 = 0 THEN NULL ELSE 'g' || (range % 37) END AS g, "
            f"DATE '2000-01-01' + CAST(range % 1000 AS INTEGER) AS d, range / 3.0 AS v "
            f"FROM range({lo}, {hi})) TO '{f}' (FORMAT parquet)"
        )
        files.append(str(f))
    return src, files


def _fingerprint(con: duckdb.DuckDBPyConnection, source: str) -> tuple:
    """Row count and an order-independent checksum of all rows: equal iff the rows are (very likely)."""
    return con.execute(f"SELECT count(*), sum(hash(id, k, g, d, v)) FROM {source}").fetchall()[0]


def _partition_sources(root: Path, info: TableInfo) -> list[str | None]:
    return [f"read_parquet({[str(root / f) for f in p.files]})" if p.files else None for p in info.partitions]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_hash_partitions_hold_exactly_their_rows(tmp_path, inputs, n):
    _, files = inputs
    info = load(n, tmp_path, "t", files, partition_by=["K"], partitions=5)
    assert (info.kind, info.keys, len(info.partitions)) == ("hash", ("k",), 5)
    assert isinstance(info.partitioning(), Hashed)
    con = duckdb.connect()
    assert _fingerprint(con, f"read_parquet({files})") == (
        _fingerprint(con, f"read_parquet({[str(tmp_path / f) for p in info.partitions for f in p.files]})")
    )
    for p, source in enumerate(_partition_sources(tmp_path, info)):
        if source is None:
            assert info.partitions[p].rows == 0
            continue
        rows, wrong = con.execute(
            f"SELECT count(*), count(*) FILTER (WHERE hash(CAST(k AS BIGINT)) % 5 <> {p}) FROM {source}"
        ).fetchall()[0]
        assert (rows, wrong) == (info.partitions[p].rows, 0)
        # Files are named by partition and rank; a rank writes no empty file.
        for f in info.partitions[p].files:
            assert Path(f).name.startswith(f"part-{p}-r")
            assert con.execute(f"SELECT count(*) FROM '{tmp_path / f}'").fetchall()[0][0] > 0


@pytest.mark.parametrize("n", [1, 3])
def test_hash_on_two_columns_keeps_null_keys(tmp_path, inputs, n):
    _, files = inputs
    info = load(n, tmp_path, "t2", files, partition_by=["g", "d"], partitions=4, scheme="hash")
    assert info.keys == ("g", "d")
    con = duckdb.connect()
    expect_nulls = con.execute(f"SELECT count(*) FROM read_parquet({files}) WHERE g IS NULL").fetchall()[0][0]
    assert expect_nulls > 0
    got_nulls = 0
    for p, source in enumerate(_partition_sources(tmp_path, info)):
        if source is None:
            continue
        wrong, nulls = con.execute(
            f"SELECT count(*) FILTER (WHERE hash(CAST(g AS VARCHAR), CAST(d AS DATE)) % 4 <> {p}), "
            f"count(*) FILTER (WHERE g IS NULL) FROM {source}"
        ).fetchall()[0]
        assert wrong == 0
        got_nulls += nulls
    assert got_nulls == expect_nulls
    assert info.rows == ROWS


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("key", ["k", "g", "d"])
def test_range_partitions_are_sorted_and_disjoint(tmp_path, inputs, n, key):
    _, files = inputs
    info = load(n, tmp_path, "r", files, partition_by=[key], partitions=6, scheme="range")
    assert (info.kind, info.keys, len(info.partitions)) == ("range", (key,), 6)
    con = duckdb.connect()
    all_files = [str(tmp_path / f) for p in info.partitions for f in p.files]
    assert _fingerprint(con, f"read_parquet({files})") == _fingerprint(con, f"read_parquet({all_files})")
    bounds = []
    for p, source in zip(info.partitions, _partition_sources(tmp_path, info), strict=True):
        if source is None:
            assert p.rows == 0
            continue
        rows, lo, hi = con.execute(f"SELECT count(*), min({key}), max({key}) FROM {source}").fetchall()[0]
        assert (rows, lo, hi) == (p.rows, p.min, p.max)
        bounds.append((lo, hi))
    assert all(a[1] < b[0] for a, b in pairwise(bounds))
    ranged = info.partitioning()
    assert isinstance(ranged, Ranged) and ranged.key == key
    # The sample spreads rows roughly evenly over the partitions.
    distinct = con.execute(f"SELECT count(DISTINCT {key}) FROM read_parquet({files})").fetchall()[0][0]
    if distinct > 100:
        assert max(p.rows for p in info.partitions) < 2 * ROWS / len(info.partitions)


@pytest.mark.parametrize("n", [1, 2])
def test_csv_input(tmp_path, inputs, n):
    _, files = inputs
    con = duckdb.connect()
    csvs = []
    for i, f in enumerate(files):
        csv = tmp_path / "src" / f"in{i}.csv"
        csv.parent.mkdir(exist_ok=True)
        con.execute(f"COPY (SELECT * FROM '{f}') TO '{csv}' (HEADER)")
        csvs.append(str(csv))
    whole = load(n, tmp_path, "c", [str(tmp_path / "src" / "*.csv")])
    assert (whole.format, whole.kind, whole.rows) == ("csv", "none", ROWS)
    assert [p.files for p in whole.partitions] == [(f"src/in{i}.csv",) for i in range(len(csvs))]
    assert dict(whole.columns)["id"] == "BIGINT"
    # Read back the way the executor reads a CSV table: the catalog's columns plus its options.
    assert "columns" not in whole.csv_options
    back = read_files(
        "csv", [tmp_path / f for p in whole.partitions for f in p.files], whole.csv_options, whole.columns
    )
    assert _fingerprint(con, back) == _fingerprint(con, f"read_parquet({files})")

    hashed = load(n, tmp_path, "ch", csvs, partition_by=["id"], partitions=3)
    assert (hashed.format, hashed.kind, hashed.rows) == ("parquet", "hash", ROWS)
    out = [str(tmp_path / f) for p in hashed.partitions for f in p.files]
    assert _fingerprint(con, f"read_parquet({files})") == _fingerprint(con, f"read_parquet({out})")


@pytest.mark.parametrize("partition_by", [None, ["id"]])
def test_csv_files_naming_the_columns_in_another_order_are_matched_by_name(tmp_path, partition_by):
    (tmp_path / "a.csv").write_text("id,v\n1,10\n2,20\n")
    (tmp_path / "b.csv").write_text("v,id\n30,3\n40,4\n")
    files = [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]
    info = load(2, tmp_path / "d", "t", files, partition_by=partition_by)
    assert _rows_as_read(tmp_path / "d", info) == _duckdb_rows(f"read_csv({files})")


def test_csv_files_with_other_columns_are_refused(tmp_path):
    (tmp_path / "a.csv").write_text("id,v\n1,10\n")
    (tmp_path / "b.csv").write_text("id,w\n3,30\n")
    files = [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]
    _, errors = run_ranks(2, lambda rt: load_table(rt, QID, tmp_path, "t", files))
    assert any(isinstance(e, CatalogError) and "b.csv has the columns ['id', 'w']" in str(e) for e in errors)


@pytest.mark.parametrize("n", [1, 3])
def test_files_registered_as_they_are(tmp_path, inputs, n):
    _, files = inputs
    info = load(n, tmp_path, "plain", files)
    assert info.kind == "none" and len(info.partitions) == len(files)
    con = duckdb.connect()
    for p, f in zip(info.partitions, files, strict=True):
        assert p.files == (f,)  # outside the data directory: absolute
        assert p.rows == con.execute(f"SELECT count(*) FROM '{f}'").fetchall()[0][0]
    assert info.columns == tuple(
        (r[0], r[1]) for r in con.execute(f"DESCRIBE SELECT * FROM '{files[0]}'").fetchall()
    )


def test_reloading_replaces_the_old_files(tmp_path, inputs):
    _, files = inputs
    first = load(3, tmp_path, "t", files, partition_by=["id"], partitions=8)
    # Three ranks and two files: rank 2 reads nothing but still takes part.
    second = load(3, tmp_path, "t", files[:2], partition_by=["k"], partitions=3, scheme="range")
    on_disk = sorted(p.name for p in (tmp_path / "t").iterdir())
    assert on_disk == sorted(Path(f).name for p in second.partitions for f in p.files)
    assert second.rows < first.rows
    assert set(Catalog.load(tmp_path).tables) == {"t"}


@pytest.mark.parametrize("n", [1, 2])
def test_missing_file_raises_catalog_error_on_every_rank(tmp_path, inputs, n):
    _, files = inputs
    missing = str(tmp_path / "nope.parquet")
    _, errors = run_ranks(
        n, lambda rt: load_table(rt, QID, tmp_path, "t", [*files, missing], ["id"], 4, "hash")
    )
    _same_cause_everywhere(errors, "nope.parquet")
    _, errors = run_ranks(
        n, lambda rt: load_table(rt, QID, tmp_path, "t", [str(tmp_path / "*.csv")], None, None, None)
    )
    _same_cause_everywhere(errors, "*.csv")


def _same_cause_everywhere(errors: list[BaseException | None], name: str) -> None:
    """A rank finds the file missing itself, or hears it from the rank that found it first."""
    assert any(isinstance(e, CatalogError) for e in errors), errors
    assert all(isinstance(e, DuckflockError) and name in str(e) for e in errors), errors


def test_unreadable_file_fails_its_rank_and_releases_the_others(tmp_path, inputs):
    _, files = inputs
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    # File 1 goes to rank 1, which cannot read it; rank 0 learns of it through the mux.
    _, errors = run_ranks(
        2, lambda rt: load_table(rt, QID, tmp_path, "t", [files[0], str(bad)], ["id"], 4, "range")
    )
    assert isinstance(errors[1], CatalogError) and "bad.parquet" in str(errors[1])
    assert isinstance(errors[0], ExecutionError) and "bad.parquet" in str(errors[0])
    assert not (tmp_path / "duckflock_catalog.json").exists()


def test_bad_arguments(tmp_path, inputs):
    _, files = inputs
    cases = [
        ({"partition_by": ["nope"]}, "nope"),
        ({"partition_by": ["id", "k"], "scheme": "range"}, "one key"),
        ({"partition_by": ["id"], "scheme": "round-robin"}, "scheme"),
        ({"partition_by": ["id"], "partitions": 0}, "at least 1"),
        ({"scheme": "hash"}, "partition_by"),
    ]
    for kw, text in cases:
        _, errors = run_ranks(1, lambda rt, kw=kw: load_table(rt, QID, tmp_path, "t", files, **kw))
        assert isinstance(errors[0], CatalogError) and text in str(errors[0]), (kw, errors[0])


def _rows_as_read(root: Path, info: TableInfo) -> list[tuple]:
    """All rows of a loaded table, sorted, read the way the executor reads its files."""
    files = [root / f for p in info.partitions for f in p.files]
    return sorted(duckdb.connect().execute(f"SELECT * FROM {read_table_files(info, files)}").fetchall())


def _duckdb_rows(source: str) -> list[tuple]:
    return sorted(duckdb.connect().execute(f"SELECT * FROM {source}").fetchall())


@pytest.mark.parametrize("partition_by", [None, ["id"]])
def test_file_names_with_glob_characters_are_read_literally(tmp_path, partition_by):
    raw = tmp_path / "raw"
    raw.mkdir()
    con = duckdb.connect()
    for i, name in enumerate(["x1", "x[1]", "y*", "y?"]):
        con.execute(f"COPY (SELECT {i} AS id, '{name}' AS src) TO '{raw / name}.parquet'")
    parts = {"partitions": 2} if partition_by else {}
    info = load(2, tmp_path / "d", "t", [str(raw / "*.parquet")], partition_by=partition_by, **parts)
    assert _rows_as_read(tmp_path / "d", info) == _duckdb_rows(f"read_parquet('{raw}/*.parquet')")


def test_hidden_files_match_a_glob_as_in_duckdb(tmp_path):
    con = duckdb.connect()
    con.execute(f"COPY (SELECT 1 AS id) TO '{tmp_path}/a.parquet'")
    con.execute(f"COPY (SELECT 2 AS id) TO '{tmp_path}/.b.parquet'")
    info = load(1, tmp_path / "d", "t", [str(tmp_path / "*.parquet")])
    assert (
        _rows_as_read(tmp_path / "d", info)
        == _duckdb_rows(f"read_parquet('{tmp_path}/*.parquet')")
        == [
            (1,),
            (2,),
        ]
    )


@pytest.mark.parametrize("partition_by", [None, ["id"]])
def test_a_file_named_twice_is_read_twice(tmp_path, inputs, partition_by):
    _, files = inputs
    info = load(2, tmp_path, "t", [files[1], files[1]], partition_by=partition_by)
    assert info.rows == 2 * 600
    assert _rows_as_read(tmp_path, info) == _duckdb_rows(f"read_parquet({[files[1], files[1]]})")


@pytest.mark.parametrize("partition_by", [None, ["g"]])
def test_a_data_directory_under_a_key_value_path_adds_no_column(tmp_path, partition_by):
    f = tmp_path / "f.parquet"
    duckdb.connect().execute(f"COPY (SELECT range AS id, range % 3 AS g FROM range(30)) TO '{f}'")
    root = tmp_path / "run=1" / "d"
    info = load(2, root, "t", [str(f)], partition_by=partition_by)
    assert [n for n, _ in info.columns] == ["id", "g"]
    assert _rows_as_read(root, info) == _duckdb_rows(f"'{f}'")
    assert Catalog.load(root).table("t").hive == ()


@pytest.mark.parametrize("partition_by", [None, ["id"]])
def test_hive_partitioned_inputs_keep_their_columns_as_duckdb_reads_them(tmp_path, partition_by):
    con = duckdb.connect()
    con.execute(
        "COPY (SELECT range AS id, CASE WHEN range % 4 = 0 THEN NULL ELSE range % 3 END AS k FROM range(20)) "
        f"TO '{tmp_path}/hive' (FORMAT parquet, PARTITION_BY (k))"
    )
    pattern = f"{tmp_path}/hive/*/*.parquet"
    info = load(2, tmp_path / "d", "h", [pattern], partition_by=partition_by)
    expect = con.execute(f"DESCRIBE SELECT * FROM read_parquet('{pattern}')").fetchall()
    assert info.columns == tuple((r[0], r[1]) for r in expect)
    assert _rows_as_read(tmp_path / "d", info) == _duckdb_rows(f"read_parquet('{pattern}')")


CSV_AS_DUCKDB_READS_IT = {
    "comment": "name,n\nalice,1\n# note, x\nbob,2\n#d,y\ncarl,3\n",
    "preamble": "exported by tool v1\nid,name\n1,a\n",
    "unquoted": 'id,name\n1,"big" deal\n',
    "spaces": "id, name\n1, a\n",
    "trailing": "id,name,\n1,a,\n",
    "dupcase": "a,A\n1,2\n",
    "semicolons": "x;y\n1;2,5\n",
}


@pytest.mark.parametrize("partitioned", [False, True])
@pytest.mark.parametrize("case", sorted(CSV_AS_DUCKDB_READS_IT))
def test_csv_is_read_as_duckdb_reads_it(tmp_path, case, partitioned):
    f = tmp_path / "in.csv"
    f.write_text(CSV_AS_DUCKDB_READS_IT[case])
    expect = _duckdb_columns(f"read_csv('{f}')")
    key = [expect[0][0]] if partitioned else None
    info = load(1, tmp_path / "d", "t", [str(f)], partition_by=key)
    assert info.columns == expect
    assert _rows_as_read(tmp_path / "d", info) == _duckdb_rows(f"read_csv('{f}')")


@pytest.mark.parametrize("partition_by", [None, ["id"]])
def test_csv_types_are_unified_over_all_files(tmp_path, partition_by):
    for name, text in [("f1", "id,v,w\n1,,10\n2,,20\n"), ("f2", "id,v,w\n3,10,1.5\n4,9,2\n")]:
        (tmp_path / f"{name}.csv").write_text(text)
    pattern = str(tmp_path / "f*.csv")
    info = load(2, tmp_path / "d", "t", [pattern], partition_by=partition_by)
    expect = _duckdb_columns(f"read_csv('{pattern}')")
    assert info.columns == expect and [t for _, t in expect] == ["BIGINT", "BIGINT", "DOUBLE"]
    assert _rows_as_read(tmp_path / "d", info) == _duckdb_rows(f"read_csv('{pattern}')")


def test_csv_files_of_different_dialects(tmp_path):
    (tmp_path / "a.csv").write_text("id,v\n1,2\n")
    (tmp_path / "b.csv").write_text("id;v\n3;4.5\n")
    pattern = str(tmp_path / "*.csv")
    info = load(2, tmp_path / "d", "t", [pattern])
    assert _rows_as_read(tmp_path / "d", info) == _duckdb_rows(f"read_csv('{pattern}')")


@pytest.mark.parametrize("partitioned", [False, True])
@pytest.mark.parametrize("header", [True, False])
def test_csv_in_hive_directories(tmp_path, header, partitioned):
    for g in (1, 2):
        (tmp_path / "hv" / f"g={g}").mkdir(parents=True)
        (tmp_path / "hv" / f"g={g}" / "f.csv").write_text(("id,v\n" if header else "") + f"{g},a{g}\n")
    pattern = str(tmp_path / "hv" / "*" / "*.csv")
    expect = _duckdb_columns(f"read_csv('{pattern}')")
    key = [expect[0][0]] if partitioned else None
    info = load(2, tmp_path / "d", "t", [pattern], partition_by=key)
    assert info.columns == expect
    assert _rows_as_read(tmp_path / "d", info) == _duckdb_rows(f"read_csv('{pattern}')")


def _duckdb_columns(source: str) -> tuple[tuple[str, str], ...]:
    return tuple(
        (r[0], r[1]) for r in duckdb.connect().execute(f"DESCRIBE SELECT * FROM {source}").fetchall()
    )


def _load_alone(root: Path, name: str, files: list[str]) -> None:
    _, errors = run_ranks(1, lambda rt: load_table(rt, QID, root, name, files, ["k"], 3))
    assert errors == [None]


def test_loads_into_one_directory_at_the_same_time_keep_every_table(tmp_path, inputs):
    _, files = inputs
    names = [f"t{i}" for i in range(6)]
    ctx = multiprocessing.get_context("fork")  # separate processes, as separate `duckflock load` runs
    procs = [ctx.Process(target=_load_alone, args=(tmp_path, n, files[1:2])) for n in names]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * len(names)
    catalog = Catalog.load(tmp_path)
    assert sorted(catalog.tables) == names
    assert all(catalog.table(n).rows == 600 for n in names)
    assert not [d for n in names for d in (tmp_path / n).iterdir() if d.is_dir()]  # no staging left


def test_ranks_read_shares_of_about_equal_bytes():
    from duckflock.ingest.shares import share

    sizes = [100, 10, 60, 40, 5, 5]
    shares = [share(sizes, r, 2) for r in range(2)]
    assert sorted(shares[0] + shares[1]) == list(range(6))
    assert sorted(sum(sizes[i] for i in s) for s in shares) == [110, 110]
    assert share([7], 1, 2) == []  # fewer files than ranks
