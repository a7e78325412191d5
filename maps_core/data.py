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


def _num(v: str) -> float:
    return float(v) if v.strip() != "" else float("nan")


def load_csv(path: str | os.PathLike[str], target: str | None = None) -> Dataset:
    """Load a CSV (two-row header with type codes, or a plain header).

    Parameters
    ----------
    path : path-like
    target : str, optional
        Label column; defaults to the ``T``-coded column or ``Class``.
    """
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    if len(rows) < 2:
        raise SchemaError(f"{path}: no data")
    names = [n.strip() for n in rows[0]]
    second = [c.strip() for c in rows[1]]
    coded = all(c in ("B", "D", "F", "E", "T") for c in second)
    codes = second if coded else [""] * len(names)
    body = rows[2:] if coded else rows[1:]
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
