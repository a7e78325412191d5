"""Reading tabular data in the project's two-row-header CSV format.

Row 1 holds column names, row 2 type codes: ``B`` binary, ``D`` discrete (integer), ``F``
float, ``E`` categorical (strings or codes, one-hot encoded here into a group of
``categorical`` dummies named ``column=value``), ``T`` target. The label column is the one
coded ``T``, else the one named ``Class``. Plain one-header CSVs are read too; their types
are inferred from the values.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass

import numpy as np

from .exceptions import SchemaError
from .schema import Feature, FeatureSchema

TYPE_CODES = {"B": "binary", "D": "integer", "F": "continuous", "E": "categorical"}


@dataclass(frozen=True)
class Dataset:
    """A numeric design matrix with its schema.

    Attributes
    ----------
    X : ndarray of shape (n_samples, n_features), float64
    y : ndarray of shape (n_samples,)
    schema : FeatureSchema
        Types from the type codes (or inferred), bounds from the observed range.
    target : str
        Name of the label column.
    """

    X: np.ndarray
    y: np.ndarray
    schema: FeatureSchema
    target: str


def read_table(
    path: str | os.PathLike[str],
) -> tuple[list[str], list[str] | None, list[list[str]]]:
    """Read a CSV with one header row, or the project's two-row header, as strings.

    Blank lines and a UTF-8 byte-order mark are ignored; every data row must have as many
    fields as the header.

    Returns
    -------
    names : list of str
    codes : list of str or None
        The type codes of row 2 (``B``, ``D``, ``F``, ``E``, ``T``) when the file has them.
    rows : list of list of str
        The data rows.

    Raises
    ------
    SchemaError
        Missing or unreadable file, no data rows, or a row of the wrong length.
    """
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            rows = [r for r in csv.reader(fh) if r and any(c.strip() for c in r)]
    except FileNotFoundError as exc:
        raise SchemaError(f"data file not found: {path}") from exc
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise SchemaError(f"cannot read {path}: {exc}") from exc
    if len(rows) < 2:
        raise SchemaError(f"{path}: expected a header row and at least one data row")
    names = [c.strip() for c in rows[0]]
    codes: list[str] | None = None
    second = [c.strip().upper() for c in rows[1]]
    if len(second) == len(names) and all(c in (*TYPE_CODES, "T") for c in second):
        codes = second
        rows = rows[1:]
    data = rows[1:]
    if not data:
        raise SchemaError(f"{path}: no data rows")
    for i, r in enumerate(data):
        if len(r) != len(names):
            line = i + (3 if codes else 2)
            raise SchemaError(f"{path}, line {line}: {len(r)} fields, the header has {len(names)}")
    return names, codes, data


def _num(v: str) -> float:
    return float(v) if v.strip() != "" else float("nan")


def load_csv(path: str | os.PathLike[str], target: str | None = None) -> Dataset:
    """Load a CSV (two-row header with type codes, or a plain header).

    Parameters
    ----------
    path : path-like
    target : str, optional
        Label column; defaults to the ``T``-coded column or ``Class``.

    Raises
    ------
    SchemaError
        Unreadable or malformed file (see :func:`read_table`), or no label column.
    """
    names, coded, body = read_table(path)
    codes = coded or [""] * len(names)
    if target is None:
        target = names[codes.index("T")] if "T" in codes else "Class"
    if target not in names:
        raise SchemaError(f"{path}: no label column {target!r}")
    ti = names.index(target)
    ycol = [r[ti] for r in body]
    try:
        y: np.ndarray = np.array([_num(v) for v in ycol])
        if np.all(y == np.round(y)):
            y = y.astype(np.int64)
    except ValueError:
        y = np.array(ycol, dtype=object)
    cols: list[np.ndarray] = []
    feats: list[Feature] = []
    for j, name in enumerate(names):
        if j == ti:
            continue
        raw = [r[j] for r in body]
        code = codes[j]
        if code == "E":
            cats = sorted(set(raw))
            for c in cats:
                col = np.array([1.0 if v == c else 0.0 for v in raw])
                cols.append(col)
                feats.append(Feature(name=f"{name}={c}", type="categorical", group=name,
                                     lower=0.0, upper=1.0))
            continue
        col = np.array([_num(v) for v in raw])
        ftype = TYPE_CODES.get(code)
        if ftype is None:  # plain CSV: infer
            if np.all(np.isin(col, (0.0, 1.0))):
                ftype = "binary"
            elif np.all(col == np.round(col)):
                ftype = "integer"
            else:
                ftype = "continuous"
        lo, hi = float(np.nanmin(col)), float(np.nanmax(col))
        if ftype == "binary":
            lo, hi = 0.0, 1.0
        cols.append(col)
        feats.append(Feature(name=name, type=ftype, lower=lo, upper=hi))
    X = np.column_stack(cols) if cols else np.zeros((len(body), 0))
    return Dataset(X=X, y=y, schema=FeatureSchema(tuple(feats)), target=target)
