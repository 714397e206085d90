"""docs/configuration.md's table of settings, rendered from ``Config``: every field, its environment
variable, its default and the ``#:`` comment lines above it in config.py.

    python -m duckflock.config_doc [docs/configuration.md]   # rewrite the table between the markers

tests/unit/test_config_doc.py fails while the file differs from what this renders.
"""

from __future__ import annotations

import ast
import inspect
import sys
from dataclasses import fields
from pathlib import Path

from duckflock import config as config_module
from duckflock.config import Config

BEGIN = "<!-- BEGIN config table: python -m duckflock.config_doc -->"
END = "<!-- END config table -->"
_MIB = 1024 * 1024


def descriptions() -> dict[str, str]:
    """Each field's ``#:`` lines (in the comment block right above it), joined into one line."""
    lines = inspect.getsource(config_module).splitlines()
    tree = ast.parse("\n".join(lines))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == Config.__name__)
    found: dict[str, str] = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        block: list[str] = []
        i = node.lineno - 2  # the line above the field, 0-based
        while i >= 0 and lines[i].lstrip().startswith("#"):
            block.insert(0, lines[i].strip())
            i -= 1
        found[node.target.id] = " ".join(line[2:].strip() for line in block if line.startswith("#:"))
    return found


def _default(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value >= _MIB and value % _MIB == 0:
        return f"{value // _MIB} MiB"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):  # 0.00005, not 5e-05
        return f"{value:.10f}".rstrip("0").rstrip(".")
    if value == "":
        return "(empty)"
    return str(value)


def render() -> str:
    """The Markdown table, markers included."""
    texts = descriptions()
    rows = [
        BEGIN,
        "",
        "| Field | Environment variable | Default | What it sets |",
        "|---|---|---|---|",
    ]
    for f in fields(Config):
        text = texts.get(f.name, "")
        if not text:
            raise ValueError(f"Config.{f.name} has no '#:' description in config.py")
        env = f"DUCKFLOCK_{f.name.upper()}"
        cell = text.replace("|", "\\|")  # a pipe would end the cell
        rows.append(f"| `{f.name}` | `{env}` | {_default(f.default)} | {cell} |")
    return "\n".join([*rows, "", END])


def updated(document: str) -> str:
    """``document`` with the text between the markers replaced by the rendered table."""
    start, end = document.find(BEGIN), document.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the markers {BEGIN!r} and {END!r} are missing")
    return document[:start] + render() + document[end + len(END) :]


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "docs/configuration.md")
    text = path.read_text()
    new = updated(text)
    if new != text:
        path.write_text(new)
        print(f"updated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
