"""The versions every rank of one job must share: rows are routed to ranks by DuckDB's hash(), which
DuckDB does not keep across versions, and plans travel between duckflock processes as they are."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from duckflock.errors import DuckflockError

SAME_EVERYWHERE = "install the same duckflock and DuckDB everywhere"


def engine_versions() -> dict[str, str]:
    """This process's duckflock and DuckDB versions."""
    import duckdb  # here: reading versions is no reason to load DuckDB at import

    try:
        own = version("duckflock")
    except PackageNotFoundError:  # run from a source tree that was never installed
        own = "unknown"
    return {"duckflock": own, "duckdb": duckdb.__version__}


def check_same(per_rank: list[dict[str, str]], what: str = "rank") -> None:
    """Raise, naming the ranks and versions, unless every rank runs the same versions."""
    if all(v == per_rank[0] for v in per_rank):
        return
    listed = "; ".join(
        f"{what} {r}: " + ", ".join(f"{k} {v}" for k, v in sorted(vs.items()))
        for r, vs in enumerate(per_rank)
    )
    plural = what + ("es" if what.endswith("s") else "s")
    raise DuckflockError(
        f"the {plural} run different versions ({listed}): their hashes would place equal keys apart; "
        + SAME_EVERYWHERE
    )
