"""Writes the generated .test files of this folder (run from the repository root; commit the output):

    python tests/sql/generate.py

aggregates.test: every DuckDB aggregate alone, grouped, over NULLs and empty tables.
combinations.test: join kinds x aggregates x groupings, and subquery predicates x projections, over
tables with NULL keys, mixed key types, duplicates, skew and empty partitions.
Queries DuckDB itself rejects are left out; everything kept must match DuckDB on every rank count.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import duckdb

HERE = Path(__file__).parent

AGGREGATES = [
    *[
        "count(x)",
        "count(*)",
        "sum(x)",
        "avg(x)",
        "min(x)",
        "max(x)",
        "product(x)",
        "mad(x)",
        "median(x)",
        "entropy(x)",
    ],
    *[
        "kurtosis(x)",
        "kurtosis_pop(x)",
        "skewness(x)",
        "sem(x)",
        "fsum(x)",
        "favg(x)",
        "kahan_sum(x)",
        "sumkahan(x)",
    ],
    *["stddev(x)", "stddev_pop(x)", "stddev_samp(x)", "variance(x)", "var_pop(x)", "var_samp(x)"],
    "quantile_cont(x, 0.25)",
    "quantile_disc(x, 0.5)",
    "quantile(x, 0.5)",
    "approx_count_distinct(x)",
    "histogram(x)",
    "bit_and(x)",
    "bit_or(x)",
    "bit_xor(x)",
    "bool_and(b)",
    "bool_or(b)",
    "count_if(b)",
    "countif(b)",
    "list(x ORDER BY x)",
    "list(DISTINCT x ORDER BY x)",
    "array_agg(x ORDER BY id)",
    "string_agg(s, ',' ORDER BY s, id)",
    "group_concat(s, ';' ORDER BY id)",
    "listagg(s, ',' ORDER BY id)",
    "geomean(x)",
    "geometric_mean(x)",
    "mean(x)",
    "arg_min(s, id)",
    "arg_max(s, id)",
    "min_by(s, id)",
    "max_by(s, id)",
    "argmin(s, id)",
    "first(x ORDER BY id)",
    "last(x ORDER BY id)",
    "sum(d)",
    "avg(d)",
    "min(d)",
    "max(d)",
    "product(d)",
    "stddev(d)",
    "sum(f)",
    "avg(f)",
    "product(f)",
    "var_pop(f)",
    "min(dt)",
    "max(dt)",
    "min(s)",
    "max(s)",
    "count(DISTINCT x)",
    "sum(DISTINCT x)",
    "avg(DISTINCT x)",
    "min(DISTINCT x)",
    "count(DISTINCT s)",
    "corr(x, id)",
    "covar_pop(x, id)",
    "covar_samp(x, id)",
    "regr_slope(x, id)",
    "regr_intercept(x, id)",
    "regr_count(x, id)",
    "regr_r2(x, id)",
    "regr_avgx(x, id)",
    "regr_sxx(x, id)",
    "weighted_avg(x, id)",
    "wavg(x, id)",
    "reservoir_quantile(x, 0.5)",
    "mode(b)",
    "sum(x) FILTER (WHERE b)",
    "count(*) FILTER (WHERE x > 10)",
    "avg(x) FILTER (WHERE g = 1)",
    "product(x) FILTER (WHERE x < 8)",
    "stddev(x) FILTER (WHERE b)",
    "min(s) FILTER (WHERE g <> 2)",
    "bool_or(x > 20) FILTER (WHERE g = 3)",
    "count(DISTINCT x) FILTER (WHERE g = 0)",
    "median(x) FILTER (WHERE b)",
    "sum(x) + count(*)",
    "coalesce(sum(x), 0) * 2",
    "max(x) - min(x)",
    "sum(x)::DOUBLE / count(*)",
    "count(x) = count(*)",
    "any_value(7)",
    "histogram(g)",
    "sum(id) FILTER (WHERE false)",
    "bit_xor(id)",
    "sum(x * g)",
    "avg(x + d)",
    "max(length(s))",
    "string_agg(DISTINCT s, ',' ORDER BY s)",
    "count(DISTINCT (g, b))",
]

AGG_SETUP = [
    "CREATE TABLE nums AS SELECT i AS id, (i % 4)::INTEGER AS g, CASE WHEN i % 5 = 0 THEN NULL ELSE "
    "(i * 7 % 23)::INTEGER END AS x, (i * 1.25)::DECIMAL(10,2) AS d, (i / 3.0)::DOUBLE AS f, "
    "i % 3 = 0 AS b, 'v' || (i % 6) AS s, DATE '2024-01-01' + i::INTEGER AS dt FROM range(1, 41) t(i)",
    "CREATE TABLE empty_nums AS SELECT * FROM nums WHERE false",
    "CREATE TABLE nulls AS SELECT id, g, NULL::INTEGER AS x, NULL::DECIMAL(10,2) AS d, NULL::DOUBLE AS f, "
    "NULL::BOOLEAN AS b, NULL::VARCHAR AS s, NULL::DATE AS dt FROM nums",
    "CREATE TABLE hashed AS SELECT * FROM nums",
]
AGG_PARTITIONS = ["nums none 5", "nulls none 3", "empty_nums hash g 3", "hashed hash id 4"]


def aggregate_queries() -> list[str]:
    out = []
    for a in AGGREGATES:
        out += [
            f"SELECT {a} AS v FROM nums",
            f"SELECT g, {a} AS v FROM nums GROUP BY g",
            f"SELECT g, {a} AS v FROM empty_nums GROUP BY g",
            f"SELECT {a} AS v FROM nulls",
            f"SELECT s, {a} AS v FROM hashed GROUP BY s HAVING count(*) > 1",
        ]
    return out


COMBO_SETUP = [
    "CREATE TABLE f AS SELECT i AS id, CASE WHEN i % 6 = 0 THEN NULL ELSE (i % 9)::INTEGER END AS k, "
    "'g' || (i % 4) AS g, (i * 0.75)::DECIMAL(10,2) AS d, DATE '2023-03-01' + (i % 17)::INTEGER AS dt, "
    "i % 5 < 2 AS flag FROM range(1, 61) t(i)",
    "CREATE TABLE dim AS SELECT CASE WHEN i % 7 = 3 THEN NULL ELSE (i % 11)::BIGINT END AS k, "
    "'n' || i AS name FROM range(15) t(i)",
    "CREATE TABLE ev AS SELECT CASE WHEN i < 30 THEN 1 ELSE i % 8 END::SMALLINT AS k, i * 1.5 AS amount "
    "FROM range(50) t(i)",
    "CREATE TABLE emp AS SELECT 1::INTEGER AS k, 'x' AS name WHERE false",
]
COMBO_PARTITIONS = ["f hash k 3", "dim none 4", "ev range k 3", "emp hash k 2"]

JOINS = [
    ("f JOIN dim o ON f.k = o.k", True),
    ("f LEFT JOIN dim o ON f.k = o.k", True),
    ("f RIGHT JOIN dim o ON f.k = o.k", True),
    ("f FULL JOIN dim o ON f.k = o.k", True),
    ("f JOIN ev o ON f.k = o.k", True),
    ("f LEFT JOIN emp o ON f.k = o.k", True),
    ("f JOIN dim o ON f.k = o.k AND f.d > 5", True),
    ("f JOIN dim o ON f.k < o.k", True),
    ("f SEMI JOIN dim o ON f.k = o.k", False),
    ("f ANTI JOIN dim o ON f.k = o.k", False),
]
COMBO_AGGS = [
    "count(*)",
    "sum(f.d)",
    "avg(f.id)",
    "min(f.g)",
    "max(f.dt)",
    "count(DISTINCT f.g)",
    "median(f.id)",
    "string_agg(f.g, ',' ORDER BY f.g, f.id)",
    "bool_or(f.flag)",
    "stddev(f.d)",
    "product(f.k % 3 + 1)",
    "count(o.k)",
    "max(o.k)",
]
GROUPS = ["", "f.g", "o.k", "f.flag, f.g", "f.k % 3"]
PREDICATES = [
    "f.k IN (SELECT k FROM dim)",
    "f.k NOT IN (SELECT k FROM dim)",
    "f.k NOT IN (SELECT k FROM dim WHERE k IS NOT NULL)",
    "f.k NOT IN (SELECT k FROM emp)",
    "EXISTS (SELECT 1 FROM ev WHERE ev.k = f.k)",
    "NOT EXISTS (SELECT 1 FROM ev WHERE ev.k = f.k AND ev.amount > 40)",
    "f.d > (SELECT avg(d) FROM f f2 WHERE f2.g = f.g)",
    "f.k > ALL (SELECT k FROM dim WHERE k IS NOT NULL)",
    "f.k < ALL (SELECT k FROM emp)",
    "f.k = ANY (SELECT k FROM ev)",
    "(SELECT count(*) FROM dim WHERE dim.k = f.k) = 0",
    "coalesce((SELECT max(amount) FROM ev WHERE ev.k = f.k), 0) < 50",
    "f.k IN (SELECT k FROM dim) IS NULL",
]
PROJECTIONS = [
    "SELECT f.id, f.k FROM f WHERE {p}",
    "SELECT count(*) AS n, sum(f.d) AS s FROM f WHERE {p}",
    "SELECT f.g, count(*) AS n FROM f WHERE {p} GROUP BY f.g",
    "SELECT f.id, ({p}) AS v FROM f",
    "SELECT f.g, count(*) FILTER (WHERE {p}) AS n FROM f GROUP BY f.g",
]


def combination_queries() -> list[str]:
    out = []
    for (join, has_o), agg, group in itertools.product(JOINS, COMBO_AGGS, GROUPS):
        if not has_o and ("o." in agg or "o." in group):
            continue
        cols = f"{group}, " if group else ""
        tail = f" GROUP BY {group}" if group else ""
        out.append(f"SELECT {cols}{agg} AS v FROM {join}{tail}")
    for p, proj in itertools.product(PREDICATES, PROJECTIONS):
        out.append(proj.format(p=p))
    return out


# Scalar functions: sqlglot parses and re-writes every expression, so each DuckDB scalar function is
# called once over a distributed table (with NULLs) to catch a re-write that changes its meaning.
SCALAR_SETUP = [
    "CREATE TABLE vals AS SELECT i AS id, CASE WHEN i % 5 = 0 THEN NULL ELSE (i * 7 % 23 - 6)::INTEGER END AS x, "
    "CASE WHEN i % 6 = 0 THEN NULL ELSE 'Ab c_' || (i % 6) || repeat('x', i % 3) END AS s, "
    "CASE WHEN i % 7 = 0 THEN NULL ELSE (i / 3.0 - 2)::DOUBLE END AS f, "
    "CASE WHEN i % 4 = 0 THEN NULL ELSE DATE '2024-02-27' + i::INTEGER END AS dt, "
    "TIMESTAMP '2024-01-01 10:00:00' + INTERVAL (i * 97) MINUTE AS ts, (i * 1.25 - 5)::DECIMAL(10,2) AS d, "
    "i % 3 = 0 AS b, [i, i % 3, NULL] AS l FROM range(1, 25) t(i)",
]
SCALAR_PARTITIONS = ["vals none 3"]
_ARG = {
    "VARCHAR": "s",
    "BIGINT": "x",
    "INTEGER": "x",
    "SMALLINT": "x",
    "TINYINT": "x",
    "DOUBLE": "f",
    "FLOAT": "f",
    "DATE": "dt",
    "TIMESTAMP": "ts",
    "DECIMAL": "d",
    "BOOLEAN": "b",
    "ANY": "x",
    "T[]": "l",
    "BIGINT[]": "l",
    "INTEGER[]": "l",
    "ANY[]": "l",
}
# Different on every call, or not a function of the row.
_VOLATILE = (
    "random",
    "uuid",
    "gen_random_uuid",
    "uuidv4",
    "uuidv7",
    "nextval",
    "currval",
    "setseed",
    "now",
    "get_current",
    "current_",
    "today",
    "txid",
    "error",
    "version",
    "getvariable",
    "transaction_timestamp",
    "to_json",
    "sleep",
    "make_random",
    "write_log",
    "duckdb_",
)


def scalar_queries() -> list[str]:
    con = duckdb.connect()
    rows = con.sql(
        "SELECT DISTINCT function_name, parameter_types FROM duckdb_functions() "
        "WHERE function_type = 'scalar' AND NOT starts_with(function_name, '__') "
        "AND function_name SIMILAR TO '[a-z_0-9]+' ORDER BY ALL"
    ).fetchall()
    out, seen = [], set()
    for name, params in rows:
        if any(name.startswith(v) for v in _VOLATILE) or not params or len(params) > 3:
            continue
        args = [_ARG.get(t) for t in params]
        if None in args:
            continue
        call = f"{name}({', '.join(args)})"
        if call in seen:
            continue
        seen.add(call)
        out.append(f"SELECT id, {call} AS v FROM vals")
    return out


# Window functions x window specs. Functions whose value depends on the order among peers only get
# specs that order totally (ending in id); the rest also get peer frames and no order at all.
ORDER_SENSITIVE = [
    "row_number()",
    "ntile(3)",
    "lag(x)",
    "lag(x, 2, -1)",
    "lead(x)",
    "lead(s, 1)",
    "first_value(x)",
    "last_value(x)",
    "nth_value(x, 2)",
    "first_value(x IGNORE NULLS)",
    "string_agg(s, ',')",
    "list(x)",
]
PEER_SAFE = [
    "rank()",
    "dense_rank()",
    "percent_rank()",
    "cume_dist()",
    "count(*)",
    "count(x)",
    "sum(x)",
    "avg(d)",
    "min(s)",
    "max(dt)",
    "stddev(f)",
    "bool_and(b)",
    "median(x)",
    "count(DISTINCT g)",
    "sum(x) FILTER (WHERE b)",
]
TOTAL_SPECS = [
    "ORDER BY id",
    "PARTITION BY g ORDER BY id",
    "PARTITION BY g ORDER BY x NULLS FIRST, id",
    "PARTITION BY g, b ORDER BY id DESC",
    "PARTITION BY g ORDER BY id ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING",
    "PARTITION BY s ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW",
    "ORDER BY dt, id ROWS BETWEEN 2 PRECEDING AND 1 PRECEDING",
    "PARTITION BY g ORDER BY id ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING",
]
PEER_SPECS = [
    "",
    "PARTITION BY g",
    "ORDER BY x",
    "PARTITION BY g ORDER BY x RANGE BETWEEN 3 PRECEDING AND CURRENT ROW",
    "PARTITION BY b ORDER BY dt RANGE BETWEEN INTERVAL 5 DAY PRECEDING AND INTERVAL 1 DAY FOLLOWING",
    "PARTITION BY g ORDER BY d GROUPS BETWEEN 1 PRECEDING AND CURRENT ROW",
]


def window_queries() -> list[str]:
    out = []
    for table in ("nums", "hashed", "empty_nums"):
        for fn, spec in itertools.product(ORDER_SENSITIVE + PEER_SAFE, TOTAL_SPECS):
            out.append(f"SELECT id, {fn} OVER ({spec}) AS w FROM {table}")
        for fn, spec in itertools.product(PEER_SAFE, PEER_SPECS):
            out.append(f"SELECT id, {fn} OVER ({spec}) AS w FROM {table}")
    for fn in PEER_SAFE:
        out.append(
            f"SELECT g, sum(x) AS t, {fn.replace('(x)', '(sum(x))')} OVER (ORDER BY g) AS w FROM nums GROUP BY g"
        )
        out.append(f"SELECT id FROM nums QUALIFY {fn} OVER (PARTITION BY g ORDER BY id) > 1")
    return out


# Join forms x key types x placements: each side stored hash-partitioned on the key, range-
# partitioned, dealt arbitrarily or empty, so every join strategy meets NULL keys and duplicates.
JOIN_SETUP = [
    "CREATE TABLE a AS SELECT i AS id, CASE WHEN i % 7 = 0 THEN NULL ELSE (i % 8)::INTEGER END AS ki, "
    "CASE WHEN i % 9 = 0 THEN NULL ELSE 'k' || (i % 6) END AS ks, DATE '2024-01-01' + (i % 5)::INTEGER AS kd, "
    "(i % 4 * 0.5)::DECIMAL(6,2) AS kn, TIMESTAMP '2024-01-01' + INTERVAL (i * 13) MINUTE AS ts FROM range(1, 49) t(i)",
    "CREATE TABLE b AS SELECT i AS id2, CASE WHEN i % 5 = 0 THEN NULL ELSE (i % 10)::BIGINT END AS ki, "
    "'k' || (i % 7) AS ks, DATE '2024-01-01' + (i % 3)::INTEGER AS kd, (i % 3 * 0.5)::DECIMAL(8,1) AS kn, "
    "TIMESTAMP '2024-01-01' + INTERVAL (i * 29) MINUTE AS ts, i * 1.5 AS amount FROM range(0, 30) t(i)",
    "CREATE TABLE a_h AS SELECT * FROM a",
    "CREATE TABLE b_h AS SELECT * FROM b",
    "CREATE TABLE b_r AS SELECT * FROM b",
    "CREATE TABLE b_e AS SELECT * FROM b WHERE false",
]
JOIN_PARTITIONS = [
    "a none 3",
    "b none 4",
    "a_h hash ki 3",
    "b_h hash ki 3",
    "b_r range ki 2",
    "b_e hash ki 2",
]
JOIN_FORMS = [
    "JOIN {r} ON {l}.{k} = {r}.{k}",
    "LEFT JOIN {r} ON {l}.{k} = {r}.{k}",
    "RIGHT JOIN {r} ON {l}.{k} = {r}.{k}",
    "FULL JOIN {r} ON {l}.{k} = {r}.{k}",
    "JOIN {r} ON {l}.{k} = {r}.{k} AND {l}.id > {r}.id2",
    "LEFT JOIN {r} ON {l}.{k} = {r}.{k} AND {r}.id2 % 2 = 0",
    "JOIN {r} ON {l}.{k} IS NOT DISTINCT FROM {r}.{k}",
    "ASOF JOIN {r} ON {l}.{k} = {r}.{k} AND {l}.ts >= {r}.ts",
    "ASOF LEFT JOIN {r} ON {l}.{k} = {r}.{k} AND {l}.ts < {r}.ts",
    "JOIN LATERAL (SELECT * FROM {r} x WHERE x.{k} = {l}.{k} ORDER BY x.id2 LIMIT 2) {r} ON true",
    "LEFT JOIN LATERAL (SELECT count(*) AS n, max(x.id2) AS id2, min(x.{k}) AS {k} FROM {r} x WHERE x.{k} = {l}.{k}) {r} ON {r}.n > 0",
]
JOIN_PROJECTIONS = [
    "SELECT {l}.id, {r}.id2 FROM {l} {j}",
    "SELECT {r}.{k}, count(*) AS n, count({l}.id) AS c FROM {l} {j} GROUP BY ALL",
]


def join_queries() -> list[str]:
    out = []
    for left, right in (("a", "b"), ("a_h", "b_h"), ("a_h", "b_r"), ("a", "b_e"), ("a_h", "b")):
        for key, form, proj in itertools.product(("ki", "ks", "kd", "kn"), JOIN_FORMS, JOIN_PROJECTIONS):
            join = form.format(l=left, r=right, k=key)
            out.append(proj.format(l=left, r=right, j=join, k=key))
    for left, right in (("a", "b"), ("a_h", "b_h"), ("a", "b_e")):
        for key in ("ki", "ks"):
            for form in ("SEMI JOIN", "ANTI JOIN"):
                out.append(f"SELECT {left}.id FROM {left} {form} {right} ON {left}.{key} = {right}.{key}")
            out.append(
                f"SELECT DISTINCT ON ({left}.{key}) {left}.{key}, {left}.id, {right}.id2 FROM {left} "
                f"LEFT JOIN {right} ON {left}.{key} = {right}.{key} ORDER BY {left}.{key}, {left}.id, {right}.id2"
            )
    return out


# Every DuckDB type as a grouping, sorting, joining and window key after exchanges: a type that does
# not cross Arrow as itself answers differently downstream (HUGEINT, UUID, ENUM, ... did).
TYPES = {
    "ti": "(i % 5 - 2)::TINYINT",
    "si": "(i % 7 * 300)::SMALLINT",
    "hi": "(i % 6)::HUGEINT * 10000000000000000000",
    "ut": "(i % 5)::UTINYINT",
    "ub": "(i % 4)::UBIGINT * 5000000000000000000",
    "uh": "(i % 3)::UHUGEINT",
    "fl": "(i % 5 / 4)::FLOAT",
    "dc": "(i % 6 * 1.5)::DECIMAL(4,1)",
    "dw": "(i % 6 * 1.125)::DECIMAL(38,10)",
    "bo": "i % 3 = 0",
    "bl": "('\\x0' || (i % 4))::BLOB",
    "tm": "TIME '10:00:00' + INTERVAL (i % 5) MINUTE",
    "ts": "(TIMESTAMP '2024-01-01' + INTERVAL (i % 5) HOUR)::TIMESTAMP_S",
    "tms": "(TIMESTAMP '2024-01-01' + INTERVAL (i % 5) HOUR)::TIMESTAMP_MS",
    "tns": "(TIMESTAMP '2024-01-01' + INTERVAL (i % 5) HOUR)::TIMESTAMP_NS",
    "tz": "(TIMESTAMPTZ '2024-01-01 00:00:00+00' + INTERVAL (i % 5) HOUR)",
    "ttz": "('12:00:00+0' || (i % 3))::TIMETZ",
    "iv": "INTERVAL (i % 4) DAY + INTERVAL (i % 3) MONTH",
    "uu": "('00000000-0000-0000-0000-00000000000' || (i % 6))::UUID",
    "js": "('{\"k\": ' || (i % 4) || '}')::JSON",
    "bt": "bitstring(CASE WHEN i % 2 = 0 THEN '10' ELSE '1' END, 6)",
    "li": "[i % 3, NULL, i % 2]",
    "ar": "[i % 2, i % 3, 1]::INTEGER[3]",
    "st": "{'a': i % 3, 'b': 'x' || (i % 2)}",
    "mp": "MAP {'k': i % 3}",
    "un": "union_value(n := (i % 3)::INTEGER)",
    "vi": "(i % 4)::VARINT * 100000000000000000000000",
}
TYPE_SETUP = [
    "CREATE TABLE ty AS SELECT i AS id, "
    + ", ".join(f"CASE WHEN i % 11 = 0 THEN NULL ELSE {e} END AS {c}" for c, e in TYPES.items())
    + " FROM range(1, 41) t(i)",
    "CREATE TABLE ty_h AS SELECT * FROM ty",
]
TYPE_PARTITIONS = ["ty none 3", "ty_h hash id 2"]


def type_queries() -> list[str]:
    out = []
    for c in TYPES:
        out += [
            f"SELECT {c}, count(*) AS n, typeof(any_value({c})) AS t FROM ty GROUP BY {c}",
            f"SELECT min({c}) AS lo, max({c}) AS hi, count(DISTINCT {c}) AS d FROM ty",
            f"SELECT id, {c} FROM ty ORDER BY {c} NULLS FIRST, id",
            f"SELECT a.id, b.id AS id2 FROM ty a JOIN ty_h b ON a.{c} = b.{c}",
            f"SELECT DISTINCT {c} FROM ty_h",
            f"SELECT id, row_number() OVER (PARTITION BY {c} ORDER BY id) AS r FROM ty",
            f"SELECT {c} FROM ty INTERSECT SELECT {c} FROM ty_h",
            f"SELECT id FROM ty WHERE {c} IN (SELECT {c} FROM ty_h WHERE id < 10)",
        ]
    return out


def write(name: str, title: list[str], setup: list[str], partitions: list[str], queries: list[str]) -> None:
    con = duckdb.connect()
    for s in setup:
        con.execute(s)
    lines = [f"# {t}" for t in title] + ["# Generated by tests/sql/generate.py.", ""]
    for s in setup:
        lines += ["statement ok", s, ""]
    for p in partitions:
        lines += [f"partition {p}", ""]
    kept = 0
    for q in queries:
        try:
            con.sql(q).fetchall()
        except duckdb.Error:
            continue
        lines += ["query", q, ""]
        kept += 1
    (HERE / name).write_text("\n".join(lines))
    print(f"{name}: {kept} queries")


if __name__ == "__main__":
    write(
        "aggregates.test",
        [
            "Every aggregate DuckDB has, alone and grouped, over NULLs and empty tables: each answer must",
            "be DuckDB's. Aggregates outside the planner's allow-list move raw rows; the rest combine partials.",
        ],
        AGG_SETUP,
        AGG_PARTITIONS,
        aggregate_queries(),
    )
    write(
        "combinations.test",
        [
            "Join kinds x aggregates x groupings, and subquery predicates x projections, over NULL keys,",
            "INTEGER/BIGINT/SMALLINT keys, duplicates, a skewed key, an empty table and empty partitions.",
        ],
        COMBO_SETUP,
        COMBO_PARTITIONS,
        combination_queries(),
    )
    write(
        "scalars.test",
        [
            "Every DuckDB scalar function with simple argument types, once, over a distributed table with NULLs."
        ],
        SCALAR_SETUP,
        SCALAR_PARTITIONS,
        scalar_queries(),
    )
    write(
        "windows.test",
        [
            "Window functions x partitions, orders and frames (ROWS / RANGE / GROUPS), over NULLs and empty tables."
        ],
        AGG_SETUP,
        AGG_PARTITIONS,
        window_queries(),
    )
    write(
        "type_matrix.test",
        ["Every DuckDB type grouped, sorted, joined, windowed and compared after exchanges."],
        TYPE_SETUP,
        TYPE_PARTITIONS,
        type_queries(),
    )
    write(
        "join_matrix.test",
        [
            "Join forms (inner/outer/non-equi/ASOF/LATERAL/semi/anti/DISTINCT ON) x key types x placements:",
            "hash-partitioned on the key, range-partitioned, dealt arbitrarily, empty; NULL keys, duplicates.",
        ],
        JOIN_SETUP,
        JOIN_PARTITIONS,
        join_queries(),
    )
