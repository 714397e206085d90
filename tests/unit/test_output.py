"""Results printed on a narrow terminal keep every character of every value."""

from rich.console import Console

from duckflock.session import print_rows


def test_narrow_terminal_wraps_values_instead_of_cutting_them():
    console = Console(width=20, record=True, color_system=None)
    value = "123456789012345678901234567890.25"
    print_rows(["sum_base_price"], [(value,)], 1, console=console)
    text = console.export_text()
    assert "…" not in text
    assert value in "".join(ch for ch in text if ch.isdigit() or ch == "."), text
