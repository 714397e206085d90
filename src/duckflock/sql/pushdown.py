"""sqlglot's ``pushdown_predicates`` without the simplification it runs first.

Before moving a WHERE or ON condition, sqlglot's rule simplifies it with sqlglot's own idea of
types, not DuckDB's: ``x < '10' AND x < '9'`` became ``x < '10'`` (literals compared as text,
where DuckDB casts them to the INTEGER column's type), ``DATE '2020-01-31' + INTERVAL 5 HOUR`` a
DATE, ``f + 0.1 > 0.3`` the exact ``f > 0.2``, ``DATE '2020-01-01' = TIMESTAMP '2020-01-01'``
FALSE, and ``x > 2147483647 + 1`` lost its overflow error: wrong answers. Predicates are moved as
written here. sqlglot offers no switch for it, so its module's ``simplify`` is swapped for the
identity during the call, under a lock (concurrent planners share the module).
"""

from __future__ import annotations

import threading

import sqlglot.optimizer.pushdown_predicates as _rule
from sqlglot import exp

_LOCK = threading.Lock()


def pushdown_predicates(expression: exp.Expr, dialect: str | None = None) -> exp.Expr:
    with _LOCK:
        simplify = _rule.simplify
        _rule.simplify = lambda condition, **_: condition
        try:
            return _rule.pushdown_predicates(expression, dialect=dialect)
        finally:
            _rule.simplify = simplify
