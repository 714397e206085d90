"""Turn the one correlated-subquery shape that is provably exact as a join into a join.

``WHERE x < (SELECT 0.2 * avg(l.q) FROM l WHERE l.k = o.k AND ...)`` (TPC-H Q2, Q17, Q20) becomes
``JOIN (SELECT 0.2 * avg(l.q) AS v, l.k AS k0 FROM l WHERE ... GROUP BY l.k) u ON u.k0 = o.k`` with
``x < u.v`` in WHERE, so the aggregate runs once per key, distributed, instead of once per outer row.

It is exact only when every condition below holds, and each is checked (anything else is left for
the planner's general method, where DuckDB evaluates the subquery itself over replicated inputs):
- the comparison is a top-level AND conjunct of WHERE: a NULL result and a missing group both drop
  the row, so an inner join is right;
- the subquery's value is NULL over an empty set (no COUNT: the "count bug"): only SUM/AVG/MIN/MAX
  combined with arithmetic, casts and literals;
- correlation is only ``inner column = outer column`` conjuncts of the subquery's WHERE, the outer
  column belongs to this SELECT's own FROM, and both columns' types compare exactly alike (so the
  GROUP BY groups exactly the rows the equality would pick: no two groups match one outer row).
"""

from __future__ import annotations

from sqlglot import exp

from duckflock.catalog.partitioning import canonical_hash_type
from duckflock.sql.scopes import conjuncts, from_items, outer_columns

_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
_STRICT_AGGS = (exp.Sum, exp.Avg, exp.Min, exp.Max)
_STRICT_SCALARS = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Neg, exp.Paren, exp.Cast)
_VOLATILE = {"random", "uuid", "gen_random_uuid", "nextval", "currval", "setseed"}
_BLOCKING = ("group", "having", "order", "limit", "offset", "distinct", "qualify", "windows", "with_", "with")


def _strict(e: exp.Expr) -> bool:
    """NULL whenever every aggregate in it is NULL, i.e. over an empty input."""
    if isinstance(e, _STRICT_AGGS):
        return True
    if not isinstance(e, _STRICT_SCALARS):
        return False
    kids = [c for c in e.iter_expressions() if not isinstance(c, exp.DataType)]
    return any(_strict(c) for c in kids) and all(_strict(c) or _constant(c) for c in kids)


def _constant(e: exp.Expr) -> bool:
    return not any(True for _ in e.find_all(exp.Column, exp.AggFunc, exp.Query))


def _column_type(col: exp.Column, aliases: dict[str, exp.Expr], table_types) -> str | None:
    """The catalog type of a column of a FROM item: a table, or the plain projection of one that
    sqlglot's qualify puts in its place (``(SELECT t.c AS c FROM t AS t) AS t``)."""
    item, name = aliases.get(col.table), col.name
    while isinstance(item, exp.Subquery) and isinstance(item.this, exp.Select):
        body = item.this
        if any(body.args.get(a) for a in ("joins", "group", "distinct", *_BLOCKING)):
            return None
        source = next((e for e in body.expressions if e.alias_or_name == name), None)
        if source is None or not isinstance(source.unalias(), exp.Column):
            return None
        name = source.unalias().name
        from_ = body.args.get("from_") or body.args.get("from")
        item = from_.this if from_ is not None else None
    if not isinstance(item, exp.Table) or not isinstance(item.this, exp.Identifier):
        return None
    if any(c.alias_or_name.lower() == item.name.lower() for c in item.root().find_all(exp.CTE)):
        return None  # maybe a CTE of the table's name: its columns' types are not the table's
    return table_types.get(item.name, {}).get(name)


def _exactly_comparable(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return False
    ca, cb = canonical_hash_type(a), canonical_hash_type(b)
    return ca == cb and ca not in ("DOUBLE", "FLOAT", "REAL")


def _rewrite(select: exp.Select, conj: exp.Expr, sub: exp.Subquery, name: str, table_types) -> bool:
    body = sub.this
    value = _single_value(body)
    if value is None:
        return False
    found = _equi_correlation(select, body, table_types)
    if found is None:
        return False
    keys, plain = found
    reduced = _outer_keys(select, keys, conj, name)
    on = exp.and_(
        *[
            exp.EQ(this=exp.column(f"_k{n}", table=name, quoted=True), expression=o.copy())
            for n, (_, o) in enumerate(keys)
        ]
    )
    derived = _grouped_by_keys(body, value, keys, plain, reduced)
    select.append(
        "joins",
        exp.Join(this=exp.Subquery(this=derived, alias=exp.TableAlias(this=exp.to_identifier(name))), on=on),
    )
    sub.replace(exp.column("_v", table=name, quoted=True))
    return True


def _single_value(body: exp.Expr) -> exp.Expr | None:
    """The one strict value a plain SELECT ... FROM ... [inner joins] subquery computes, or None."""
    if not isinstance(body, exp.Select) or any(body.args.get(a) for a in _BLOCKING):
        return None
    if len(body.expressions) != 1 or not (body.args.get("from_") or body.args.get("from")):
        return None
    value = body.expressions[0].unalias()
    if not _strict(value) or any(True for _ in value.find_all(exp.Query, exp.Window)):
        return None
    if any(
        j.args.get("side") or j.args.get("kind") or j.args.get("method") for j in body.args.get("joins") or []
    ):
        return None
    return value


def _equi_correlation(
    select: exp.Select, body: exp.Select, table_types
) -> tuple[list[tuple[exp.Column, exp.Column]], list[exp.Expr]] | None:
    """The subquery's (inner column, outer column) equalities of exactly comparable types and its
    uncorrelated WHERE conjuncts; None when it refers to the outer query in any other way."""
    inner = from_items(body)
    outer = from_items(select)
    where = body.args.get("where")
    keys: list[tuple[exp.Column, exp.Column]] = []
    plain: list[exp.Expr] = []
    for c in conjuncts(where.this) if where is not None else []:
        if not outer_columns(body, within=c):
            plain.append(c)
            continue
        if not isinstance(c, exp.EQ) or not all(isinstance(s, exp.Column) for s in (c.this, c.expression)):
            return None
        a, b = c.this, c.expression
        i, o = (a, b) if a.table in inner else (b, a)
        if i.table not in inner or o.table not in outer or o.table in inner:
            return None
        if not _exactly_comparable(_column_type(i, inner, table_types), _column_type(o, outer, table_types)):
            return None
        keys.append((i, o))
    if not keys:
        return None
    # No other reference to an enclosing scope anywhere in the subquery.
    rest = body.copy()
    rest.set("where", None)
    if outer_columns(rest):
        return None
    return keys, plain


def _outer_keys(
    select: exp.Select, keys: list[tuple[exp.Column, exp.Column]], conj: exp.Expr, name: str
) -> exp.Join | None:
    """A join restricting the subquery's rows to the keys outer rows can have (the "magic set" of
    DuckDB's delim join): the distinct outer key values of the one FROM item they come from, under
    the WHERE conjuncts on that item alone. TPC-H Q17 then averages the lineitems of 200 parts per
    SF 1, not of all 200,000. Exact: every outer row that can meet a group has such a key (a row
    whose item is NULL-extended has NULL keys and meets none). None when the keys come from
    several items or no conjunct filters theirs: the restriction would cost a join and save nothing."""
    tables = {o.table for _, o in keys}
    if len(tables) != 1:
        return None
    (alias,) = tables
    item = from_items(select).get(alias)
    where = select.args.get("where")
    if item is None or where is None:
        return None
    filters = [c for c in conjuncts(where.this) if c is not conj and _only_of(c, alias)]
    if not filters:
        return None
    magic = f"{name}_m"
    distinct = exp.select(*[exp.alias_(o.copy(), f"_m{n}", quoted=True) for n, (_, o) in enumerate(keys)])
    distinct = distinct.from_(item.copy()).where(exp.and_(*[c.copy() for c in filters])).distinct()
    on = exp.and_(
        *[
            exp.EQ(this=i.copy(), expression=exp.column(f"_m{n}", table=magic, quoted=True))
            for n, (i, _) in enumerate(keys)
        ]
    )
    return exp.Join(
        this=exp.Subquery(this=distinct, alias=exp.TableAlias(this=exp.to_identifier(magic))), on=on
    )


def _only_of(conj: exp.Expr, alias: str) -> bool:
    """Whether a WHERE conjunct reads columns of the FROM item ``alias`` and of no other item of
    its SELECT or an enclosing one, and gives the same answer each time it is evaluated."""
    columns = outer_columns(conj)
    if not columns or any(c.table != alias for c in columns):
        return False
    names = {f.name.lower() for f in conj.find_all(exp.Func) if isinstance(f, exp.Anonymous)}
    volatile = any(True for _ in conj.find_all(exp.Rand, exp.AggFunc, exp.Window))
    return not volatile and not names & _VOLATILE


def _grouped_by_keys(
    body: exp.Select,
    value: exp.Expr,
    keys: list[tuple[exp.Column, exp.Column]],
    plain: list[exp.Expr],
    reduced: exp.Join | None,
) -> exp.Select:
    """The subquery as a derived table: its value ``_v`` per inner key ``_k0``, ``_k1``, ...; only
    for the keys of ``reduced`` when given."""
    derived = exp.select(exp.alias_(value.copy(), "_v", quoted=True))
    for n, (i, _) in enumerate(keys):
        derived = derived.select(exp.alias_(i.copy(), f"_k{n}", quoted=True), copy=False)
    from_ = body.args.get("from_") or body.args.get("from")
    assert from_ is not None  # only SELECTs with a FROM are decorrelated
    derived.set("from_", from_.copy())
    joins = [j.copy() for j in body.args.get("joins") or []] + ([reduced] if reduced is not None else [])
    if joins:
        derived.set("joins", joins)
    if plain:
        derived.set("where", exp.Where(this=exp.and_(*[c.copy() for c in plain])))
    derived.set("group", exp.Group(expressions=[i.copy() for i, _ in keys]))
    return derived


def scalar_subqueries_to_joins(expression: exp.Expr, table_types=None) -> exp.Expr:
    """An optimizer rule, after qualify; ``table_types``: catalog table -> column -> DuckDB type."""
    table_types = table_types or {}
    counter = 0
    for select in list(expression.find_all(exp.Select)):
        where = select.args.get("where")
        if where is None:
            continue
        for conj in conjuncts(where.this):
            if not isinstance(conj, _COMPARISONS):
                continue
            for side in (conj.this, conj.expression):
                if isinstance(side, exp.Subquery) and not side.alias:
                    counter += 1
                    if _rewrite(select, conj, side, f"_sq{counter}", table_types):
                        break
    return expression
