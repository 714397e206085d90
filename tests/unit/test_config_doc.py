"""docs/configuration.md's table is what ``python -m duckflock.config_doc`` renders from Config."""

from dataclasses import fields
from pathlib import Path

from duckflock.config import Config
from duckflock.config_doc import BEGIN, END, descriptions, main, render, updated

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_doc_matches_config() -> None:
    text = DOC.read_text()
    assert updated(text) == text, "docs/configuration.md is stale: run python -m duckflock.config_doc"


def test_every_field_is_described_once() -> None:
    texts = descriptions()
    assert set(texts) == {f.name for f in fields(Config)}
    assert all(texts.values())
    table = render()
    assert all(table.count(f"| `{f.name}` |") == 1 for f in fields(Config))


def test_regenerating_rewrites_only_the_table(tmp_path: Path) -> None:
    doc = tmp_path / "configuration.md"
    doc.write_text(f"# Settings\n\nbefore\n\n{BEGIN}\n| stale |\n{END}\n\nafter\n")
    assert main([str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# Settings\n\nbefore\n\n") and text.endswith("\n\nafter\n")
    assert "| stale |" not in text and "`broadcast_threshold_bytes`" in text
