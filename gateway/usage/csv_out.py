"""CSV as the ledger writes it (admin API ``format=csv`` and ``kvgate usage --csv``), safe to
open in a spreadsheet.

A cell is text or a number by its Python type, never by its look:

    int / float (bool included)   written as the number it is, negative ones too ("-3")
    None                          an empty cell (``""``)
    anything else (str, ...)      text: quoted, and prefixed with ``'`` when it begins with
                                  ``=`` ``+`` ``-`` ``@`` tab or carriage return

Text that begins with one of those characters is what a spreadsheet evaluates as a formula
(OWASP "CSV Injection"): an ``end_user`` of ``=HYPERLINK(...)`` becomes the text
``'=HYPERLINK(...)``. Every text cell is quoted as well, so a separator inside one (a comma, or
the semicolon of locales that split on it) never starts a new cell that could begin with a
formula; quotes inside are doubled by the csv module. Numbers come from typed columns (token
counts, milliseconds, spend), never from text a client chose, so they are left as numbers.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value: Any) -> Any:
    """The value to write for one cell: numbers and None as they are, text neutralized."""
    if value is None or isinstance(value, int | float):
        return value
    text = str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


class _Dialect(csv.excel):
    lineterminator = "\n"
    quoting = csv.QUOTE_NONNUMERIC  # text quoted, numbers bare


def write_csv(out: TextIO, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    """A header of ``columns``, then one line per row (keys outside ``columns`` ignored)."""
    writer = csv.writer(out, _Dialect)
    writer.writerow(columns)
    for row in rows:
        writer.writerow([safe_cell(row.get(c)) for c in columns])
