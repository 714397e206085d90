"""TPC-H generation: catalog content, row counts and the alignment of lineitem/orders and partsupp/part."""

from __future__ import annotations

import threading
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import duckdb
import pytest

from duckflock.catalog import Catalog, Ranged
from duckflock.catalog.partitioning import co_located, ranges_aligned
from duckflock.ingest.tpch import (
    ALIGNED,
    RANGE_KEYS,
    TABLES,
    _progress,
    _run_parallel,
    align_parts,
    generate_tpch,
    parent_intervals,
    part_file,
)
from support import wait_until

SF = 0.01


@pytest.fixture(scope="module", params=[3, 4])
def tpch(request, tmp_path_factory) -> tuple[Catalog, int]:
    parts = request.param
    out = tmp_path_factory.mktemp(f"tpch{parts}")
    return generate_tpch(SF, out, parts=parts, progress=False), parts


def _files(cat: Catalog, table: str) -> list[str]:
    return [cat.path(f) for p in cat.table(table).partitions for f in p.files]


def _part_of_file_sql(cat: Catalog, table: str) -> str:
    """SELECT over a table's files with a column ``part``: the catalog partition each row is in."""
    cases = " ".join(
        f"WHEN filename = '{cat.path(f)}' THEN {i}"
        for i, p in enumerate(cat.table(table).partitions)
        for f in p.files
    )
    return f"SELECT *, CASE {cases} END AS part FROM read_parquet({_files(cat, table)}, filename = true)"


def test_catalog_lists_every_table_with_its_partitioning(tpch):
    cat, parts = tpch
    assert set(cat.tables) == set(TABLES)
    assert cat.meta["tpch"] == {"sf": SF, "parts": parts}
    reloaded = Catalog.load(cat.root)
    assert reloaded.tables == cat.tables
    for name, info in cat.tables.items():
        assert info.format == "parquet"
        if name in RANGE_KEYS:
            assert (info.kind, info.keys, len(info.partitions)) == ("range", (RANGE_KEYS[name],), parts)
        else:
            assert (info.kind, info.keys, len(info.partitions)) == ("none", (), 1)
        for p in info.partitions:
            for f in p.files:
                assert not Path(f).is_absolute() and (cat.root / f).is_file()


def test_schema_rows_and_bounds_match_the_files(tpch):
    cat, _ = tpch
    con = duckdb.connect()
    for name, info in cat.tables.items():
        files = _files(cat, name)
        described = con.execute(f"DESCRIBE SELECT * FROM read_parquet({files})").fetchall()
        assert info.columns == tuple((r[0], r[1]) for r in described)
        assert info.rows == con.execute(f"SELECT count(*) FROM read_parquet({files})").fetchall()[0][0]
        # Every generated file is in the catalog: nothing is left out of a table.
        on_disk = sorted(str(f) for f in (cat.root / name).glob("*.parquet"))
        assert sorted(files) == on_disk
        for p in info.partitions:
            if not p.files:
                assert p.rows == 0
                continue
            key = RANGE_KEYS.get(name)
            agg = f"min({key}), max({key})" if key else "NULL, NULL"
            got = con.execute(
                f"SELECT count(*), {agg} FROM read_parquet({[cat.path(f) for f in p.files]})"
            ).fetchall()[0]
            assert (p.rows, p.min, p.max) == got


def test_range_bounds_are_sorted_and_disjoint(tpch):
    cat, _ = tpch
    for name in RANGE_KEYS:
        ranged = cat.table(name).partitioning()
        assert isinstance(ranged, Ranged)
        bounds = [b for b in ranged.bounds if b is not None]
        assert all(lo <= hi for lo, hi in bounds)
        assert all(a[1] < b[0] for a, b in pairwise(bounds))


@pytest.mark.parametrize("child", sorted(ALIGNED))
def test_children_are_aligned_with_their_parents(tpch, child):
    cat, _ = tpch
    parent = ALIGNED[child]
    ck, pk = RANGE_KEYS[child], RANGE_KEYS[parent]
    con = duckdb.connect()
    # No key value in two parts of the child.
    split = con.execute(
        f"SELECT count(*) FROM (SELECT {ck} FROM ({_part_of_file_sql(cat, child)}) "
        f"GROUP BY {ck} HAVING count(DISTINCT part) > 1)"
    ).fetchall()[0][0]
    assert split == 0
    # Every child row is in the same part number as its parent row.
    rows, matched, same = con.execute(
        f"SELECT count(*), count(p.part), count(*) FILTER (WHERE c.part = p.part) "
        f"FROM ({_part_of_file_sql(cat, child)}) c LEFT JOIN ({_part_of_file_sql(cat, parent)}) p "
        f"ON c.{ck} = p.{pk}"
    ).fetchall()[0]
    assert rows == cat.table(child).rows and matched == rows and same == rows
    # ... so the catalog lets the planner join them without moving rows.
    left, right = cat.table(parent).partitioning(), cat.table(child).partitioning()
    assert isinstance(left, Ranged) and isinstance(right, Ranged)
    assert ranges_aligned(left, right)
    assert co_located(left, right, [(pk, ck)], ["BIGINT"])


def test_second_call_reuses_the_data(tpch):
    cat, parts = tpch
    stamps = {
        f: (cat.root / f).stat().st_mtime_ns
        for t in cat.tables.values()
        for p in t.partitions
        for f in p.files
    }
    again = generate_tpch(SF, cat.root, parts=parts, progress=False)
    assert again.tables == cat.tables
    assert stamps == {f: (cat.root / f).stat().st_mtime_ns for f in stamps}


def test_align_parts_fixes_parts_split_by_row_count(tmp_path, tpch):
    """tpchgen may split lineitem by row count; rebuild such a split and check the rewrite fixes it."""
    cat, parts = tpch
    con = duckdb.connect()
    lineitem = _files(cat, "lineitem")
    total = cat.table("lineitem").rows
    # parts-1 parts of equal row counts in key order: orders straddle part boundaries, and the file of
    # the last part is missing altogether.
    con.execute(
        f"CREATE TABLE l AS SELECT *, (row_number() OVER (ORDER BY l_orderkey, l_linenumber) - 1) * "
        f"{parts - 1} // {total} + 1 AS n FROM read_parquet({lineitem})"
    )
    assert con.execute("SELECT count(*) FROM l").fetchall()[0][0] == total
    files = [part_file(tmp_path, "lineitem", i) for i in range(1, parts + 1)]
    files[0].parent.mkdir(parents=True)
    for i, f in enumerate(files[:-1], start=1):
        con.execute(f"COPY (SELECT * EXCLUDE (n) FROM l WHERE n = {i}) TO '{f}' (FORMAT parquet)")
    before = con.execute(
        f"SELECT count(*), sum(hash(COLUMNS(*))) FROM read_parquet({[str(f) for f in files[:-1]]})"
    )
    before = before.fetchall()[0]

    intervals = parent_intervals([p.max for p in cat.table("orders").partitions])
    rewritten = align_parts(files, "l_orderkey", intervals, jobs=2)
    assert rewritten >= 2
    assert all(f.is_file() for f in files)
    paths = [str(f) for f in files]
    after = con.execute(f"SELECT count(*), sum(hash(COLUMNS(*))) FROM read_parquet({paths})").fetchall()[0]
    assert after == before
    split = con.execute(
        f"SELECT count(*) FROM (SELECT l_orderkey FROM read_parquet({paths}, filename = true) "
        f"GROUP BY l_orderkey HAVING count(DISTINCT filename) > 1)"
    ).fetchall()[0][0]
    assert split == 0
    # Each rewritten part now holds exactly the lineitems of the same orders part as generated.
    for mine, generated in zip(files, lineitem, strict=True):
        diff = con.execute(
            f"SELECT count(*) FROM (SELECT * FROM '{mine}' EXCEPT ALL SELECT * FROM '{generated}')"
        ).fetchall()[0][0]
        assert diff == 0
        assert (
            con.execute(f"SELECT count(*) FROM '{mine}'").fetchall()[0]
            == con.execute(f"SELECT count(*) FROM '{generated}'").fetchall()[0]
        )
    assert align_parts(files, "l_orderkey", intervals, jobs=2) == 0  # aligned parts are left alone


def test_parent_intervals_cover_every_key_once():
    assert parent_intervals([10, None, 30, 40]) == [(None, 10), (10, 10), (10, 30), (30, None)]
    assert parent_intervals([5]) == [(None, None)]


def test_string_widths_are_recorded_and_added_to_older_catalogs(tpch):
    """A comment column is estimated wider than a flag; a catalog written without widths gets them
    on the next call, its data untouched."""
    cat, parts = tpch
    widths = dict(cat.table("partsupp").widths)
    assert widths["ps_comment"] > 100 > dict(cat.table("lineitem").widths)["l_returnflag"]
    old = {name: replace(info, widths=()) for name, info in cat.tables.items()}
    for info in old.values():
        cat.put(info)
    cat.save()
    again = generate_tpch(SF, cat.root, parts=parts, progress=False)
    assert dict(again.table("partsupp").widths) == widths
    for info in again.tables.values():  # the module's catalog as it was
        cat.put(info)


def test_the_bar_counts_each_part_as_it_ends():
    """Not only once the last part has ended: at SF 1 the bar stood at 0 for the whole generation."""
    release = threading.Event()

    def ends_when_released() -> None:
        release.wait(60)

    with _progress(False) as bar:
        tasks = [lambda: None, ends_when_released]
        runner = threading.Thread(target=_run_parallel, args=(tasks, 2, bar, "parts"))
        runner.start()
        try:
            wait_until(lambda: bar.tasks and bar.tasks[0].completed == 1, "the ended part was not counted")
            assert runner.is_alive() and bar.tasks[0].completed == 1  # the other part still runs
        finally:
            release.set()
            runner.join(60)
    assert bar.tasks[0].completed == 2
