"""What the ``%%agent`` magic writes into a prompt and reads from an answer, without a
kernel: ``{name}`` placeholders and their bounds, the "Based on" line of a lineage of any
shape, and the corrected cell of a ``%agent fix`` answer. The kernel tests
(``test_magic_notebook.py``) run the same through a real notebook and PAW."""

from __future__ import annotations

import pandas as pd

from paw_client.magic import (
    FRAME_COLUMNS,
    FRAME_ROWS,
    VALUE_MAX_CHARS,
    based_on,
    corrected_cell,
    interpolate,
)


class Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class Account:
    owner = "ada"

    @property
    def balance(self) -> int:
        raise PermissionError("not yours")


def test_only_braces_naming_a_public_variable_are_filled():
    namespace = {"n": 3, "name": "Ada", "account": Account(), "odd": Unprintable(), "_x": 1}
    prompt = (
        "{n} {name} {account.owner} | {account.balance} {odd} {_x} {n._hidden} {missing} "
        '{"n": 1} {n for n in y} {{n}} {{{n}}} {n!r} {n:>4} { n } {In} {for} {n.real.imag}'
    )
    assert interpolate(prompt, namespace, hidden={"In"}) == (
        "3 Ada ada | {account.balance} <Unprintable instance at "
        + f"{id(namespace['odd']):#x}> "
        + "{_x} {n._hidden} {missing} "
        + '{"n": 1} {n for n in y} {{n}} {{{n}}} {n!r} {n:>4} { n } {In} {for} 0'
    )  # a repr that raises: reprlib's stand-in


def test_a_value_is_bounded_and_one_line_values_stay_inline():
    big = {
        "words": "w" * (VALUE_MAX_CHARS + 500),
        "numbers": list(range(100_000)),
        "nested": [[[[[1]]]]],
    }
    filled = interpolate("A {words} B {numbers} C {nested}", big)
    words = filled.split(" B ")[0]
    assert words == "A " + "w" * VALUE_MAX_CHARS + "… [500 more characters]"
    assert "[0, 1, 2," in filled and "49, ...]" in filled and "99999" not in filled
    assert filled.endswith(" C [[[[[...]]]]]")  # four levels deep


def test_a_dataframe_is_its_shape_columns_and_first_rows_bounded():
    wide = pd.DataFrame({f"c{i}": range(1_000) for i in range(100)})
    filled = interpolate("look: {wide}", {"wide": wide})
    assert filled.startswith("look: \n```text\nDataFrame wide: 1000 rows x 100 columns\n")
    assert filled.endswith("\n```\n")
    table = filled.split("first rows:\n", 1)[1]
    assert f"\n{FRAME_ROWS - 1} " in table and f"\n{FRAME_ROWS} " not in table
    assert "..." in table.splitlines()[0]  # columns past FRAME_COLUMNS are elided
    assert table.splitlines()[0].split().count("...") == 1
    assert len(table.splitlines()[0].split()) == FRAME_COLUMNS + 1
    assert f"c{FRAME_COLUMNS - 1} (int64), … 70 more\n" in filled
    assert len(filled) < VALUE_MAX_CHARS and "more characters]" not in filled


def test_a_dataframe_too_big_for_its_bound_is_cut():
    words = pd.DataFrame({f"c{i}": ["w" * 50] * 30 for i in range(30)})
    filled = interpolate("{words}", {"words": words})
    assert filled.endswith(" more characters]\n```\n")
    assert len(filled) < VALUE_MAX_CHARS + 100


def test_based_on_names_tables_then_knowledge_and_tolerates_any_shape():
    lineage = {
        "datasources": ["shop"],
        "entries": [
            {"id": 1, "kind": "schema", "title": "orders", "datasource": "shop", "source": "given"},
            {"id": 2, "kind": "doc", "title": "Revenue", "datasource": "shop", "source": "given"},
            {"id": 3, "kind": "example", "title": "Monthly revenue", "source": "retrieved"},
        ],
        "tables": ["orders", "customers"],
        "columns": ["orders.total"],
    }
    assert based_on(lineage) == (
        "Based on: `orders`, `customers`; doc *Revenue*; example *Monthly revenue*"
    )
    assert based_on({"datasources": ["shop"], "entries": [], "tables": []}) == (
        "Based on: datasource `shop`"
    )
    for odd in (None, {}, [], "x", {"tables": "orders", "entries": [None, 3, {"kind": "doc"}]}):
        assert based_on(odd) == ""


def test_the_corrected_cell_is_the_answers_last_python_block():
    answer = (
        "The divisor is zero.\n\n```text\nZeroDivisionError\n```\n\nFirst:\n```python\n"
        "print(1)\n```\nThen the cell:\n```py\ntotal = 10\nratio(total, 1)\n```\nDone."
    )
    assert corrected_cell(answer) == "total = 10\nratio(total, 1)"
    assert corrected_cell("plain\n```\nx = 1\n```") == "x = 1"
    assert corrected_cell("no code, only `inline` code") is None
    assert corrected_cell("```sql\nSELECT 1\n```") is None
    assert corrected_cell("```python\n\n```") is None
