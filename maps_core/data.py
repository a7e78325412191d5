"""Reading tabular data in the project's two-row-header CSV format: the one CSV-to-schema path.

Row 1 holds column names, row 2 type codes. Every entry point (``load_csv``, ``cfmaps build
--data``, the demo, the benchmarks) reads a file through :func:`load_csv`, so a file means
the same schema wherever it is read. One meaning per code:

``B``
    binary: the values must be 0 or 1; bounds [0, 1].
``D``
    discrete: an ``integer`` feature; the values must be whole numbers; bounds are the
    observed range.
``F``
    float: a ``continuous`` feature (even when every value happens to be whole, unless
    ``whole_floats_as_integers``); bounds are the observed range.
``E``
    categorical: one-hot encoded here into a group of ``categorical`` 0/1 columns named
    ``column=value``, one per distinct value, in sorted (string) order; in a column of
    numbers only, spellings of the same number (``1``, ``1.0``) are one value, named by its
    first spelling in that order, as the ``codes`` encoding reads them. A column holding a
    single category carries no information and cannot form a group (a one-hot group needs
    two columns): it loads as one constant ``binary`` column ``column=value`` with bounds
    [1, 1], so the design matrix keeps every category the file names.
``T``
    the label column (else the column named by ``target``, else ``Class``).

Plain one-header CSVs are read too; their types are inferred from the values (0/1 columns
binary, whole-number columns integer, else continuous).

Missing values are the (case-insensitive) tokens of :data:`MISSING`. They load as NaN: in a
numeric column that cell, in an ``E`` column every column of its group. Bounds are taken
over the values present. A missing label is an error.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass

import numpy as np

from .exceptions import SchemaError
from .schema import Feature, FeatureSchema

__all__ = ["MISSING", "TYPE_CODES", "Dataset", "load_csv", "read_table"]

TYPE_CODES = {"B": "binary", "D": "integer", "F": "continuous", "E": "categorical"}
#: Cell values read as missing (compared case-insensitively, after stripping blanks).
MISSING = frozenset({"", "na", "nan", "?", "null", "none"})


@dataclass(frozen=True)
class Dataset:
    """A numeric design matrix with its schema.

    Attributes
    ----------
    X : ndarray of shape (n_samples, n_features), float64
        NaN where a value is missing.
    y : ndarray of shape (n_samples,) or None
        Integer labels when every label is a whole number, else strings. ``None`` only when
        :func:`load_csv` was asked not to require a label column and found none.
    schema : FeatureSchema
        Types from the type codes (or inferred), bounds from the observed range.
    target : str or None
        Name of the label column.
    """

    X: np.ndarray
    y: np.ndarray | None
    schema: FeatureSchema
    target: str | None


def read_table(
    path: str | os.PathLike[str],
) -> tuple[list[str], list[str] | None, list[list[str]]]:
    """Read a CSV with one header row, or the project's two-row header, as strings.

    Blank lines (and lines of empty fields, as spreadsheets export blank rows), a UTF-8
    byte-order mark and columns with neither a name nor a value (a trailing comma on every
    line) are ignored; every column must have its own name, and every data row as many
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
        Missing or unreadable file, no data rows, a column without a name or with the
        name of another, or a row of the wrong length.
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
    rows = _drop_unnamed_empty(rows)
    names = [c.strip() for c in rows[0]]
    for j, name in enumerate(names):
        if not name:
            raise SchemaError(f"{path}: column {j + 1} has no name in the header row")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:  # read by name, the first of two would stand for both (labels included)
        raise SchemaError(f"{path}: the header names {', '.join(map(repr, repeated))} more "
                          "than once; give every column its own name")
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


def _drop_unnamed_empty(rows: list[list[str]]) -> list[list[str]]:
    """``rows`` without the columns that have no name and no value in any row: the trailing
    comma on every line of a spreadsheet's export, which hid the type row."""
    header = rows[0]
    drop = {j for j, name in enumerate(header) if not name.strip()
            and all(j >= len(r) or not r[j].strip() for r in rows[1:])}
    if not drop:
        return rows
    return [[c for j, c in enumerate(r) if j not in drop] for r in rows]


def _is_missing(v: str) -> bool:
    return v.strip().lower() in MISSING


def _float(v: str) -> float:
    """A CSV cell's number. Python's ``float`` also reads its own spellings, which are no
    number in a CSV file: ``1_000`` (refused, ValueError) and ``-nan`` or ``+nan`` (NaN,
    which the callers treat as a missing value, as they treat ``nan``)."""
    if "_" in v:
        raise ValueError(f"not a number: {v!r}")
    return float(v)


def _numbers(raw: list[str], column: str, first_line: int, path: object) -> np.ndarray:
    """A column's cells as float64, NaN where missing; a non-numeric or infinite value is a
    SchemaError naming the line and column."""
    out = np.empty(len(raw), dtype=np.float64)
    for i, v in enumerate(raw):
        if _is_missing(v):
            out[i] = math.nan
            continue
        try:
            out[i] = _float(v)
        except ValueError:
            raise SchemaError(
                f"{path}, line {first_line + i}: column {column!r} has the non-numeric value "
                f"{v.strip()!r}; declare the column E (categorical) in a two-row header to "
                "one-hot encode it, or encode it before training"
            ) from None
        if math.isinf(out[i]):
            raise SchemaError(f"{path}, line {first_line + i}: column {column!r} has an infinite value")
    return out


def _labels(raw: list[str], column: str, first_line: int, path: object) -> np.ndarray:
    for i, v in enumerate(raw):
        if _is_missing(v):
            raise SchemaError(f"{path}, line {first_line + i}: the label {column!r} is missing")
    try:
        y = np.array([_float(v) for v in raw])
    except ValueError:
        return np.array([v.strip() for v in raw], dtype=object)
    nan = np.flatnonzero(np.isnan(y))  # "-nan", "+nan": spellings MISSING lacks
    if nan.size:
        raise SchemaError(f"{path}, line {first_line + int(nan[0])}: the label {column!r} is "
                          "missing")
    inf = np.flatnonzero(np.isinf(y))
    if inf.size:
        raise SchemaError(f"{path}, line {first_line + int(inf[0])}: the label {column!r} is "
                          "infinite")
    if np.all(y == np.round(y)):
        return y.astype(np.int64)
    return y


def _one_hot(raw: list[str], name: str) -> tuple[list[np.ndarray], list[Feature]]:
    """The dummies of an ``E`` column (see the module docs)."""
    present = [not _is_missing(v) for v in raw]
    values = [v.strip() for v in raw]
    cats = sorted({v for v, ok in zip(values, present, strict=True) if ok})
    same = _same_numbers(cats)
    if same:  # "1" and "1.0" are one category, as in codes (_codes): the first spelling
        values = [same.get(v, v) for v in values]
        cats = sorted(set(same.values()))
    cols: list[np.ndarray] = []
    feats: list[Feature] = []
    for c in cats:
        col = np.array([(1.0 if v == c else 0.0) if ok else math.nan
                        for v, ok in zip(values, present, strict=True)])
        cols.append(col)
        if len(cats) == 1:  # a constant: no group of one
            feats.append(Feature(name=f"{name}={c}", type="binary", lower=1.0, upper=1.0))
        else:
            feats.append(Feature(name=f"{name}={c}", type="categorical", group=name,
                                 lower=0.0, upper=1.0))
    return cols, feats


def _same_numbers(cats: list[str]) -> dict[str, str]:
    """When every category of ``cats`` (sorted) is a finite number, each spelling's first
    spelling (in sorted order) of the same number: ``{"1": "1", "1.0": "1"}``; else, or
    when no two spellings share a number, ``{}``."""
    try:
        nums = [_float(v) for v in cats]
    except ValueError:
        return {}
    if not all(math.isfinite(n) for n in nums):
        return {}
    first: dict[float, str] = {}
    for v, n in zip(cats, nums, strict=True):
        first.setdefault(n, v)
    if len(first) == len(cats):
        return {}
    return {v: first[n] for v, n in zip(cats, nums, strict=True)}


def _codes(raw: list[str]) -> np.ndarray:
    """An ``E`` column as codes: its values when every one is a non-negative integer,
    else each category's position among the sorted distinct values (as pandas' category
    dtype numbers them: numbers in numeric order, anything else as strings); NaN where
    missing."""
    values = [None if _is_missing(v) else v.strip() for v in raw]
    present = sorted({v for v in values if v is not None})
    try:
        nums = {v: _float(v) for v in present}
    except ValueError:
        nums = {}
    if nums and all(math.isfinite(n) for n in nums.values()):
        if all(n >= 0 and n == math.floor(n) for n in nums.values()):
            return np.array([math.nan if v is None else nums[v] for v in values])
        order = sorted(set(nums.values()))
        rank = {n: float(i) for i, n in enumerate(order)}
        return np.array([math.nan if v is None else rank[nums[v]] for v in values])
    pos = {v: float(i) for i, v in enumerate(present)}
    return np.array([math.nan if v is None else pos[v] for v in values])


def _nominal_feature(col: np.ndarray, name: str, path: object) -> Feature:
    """The ``nominal`` feature of an ``E`` column kept as codes."""
    present = col[np.isfinite(col)]
    if not present.size:
        raise SchemaError(f"{path}: column {name!r} (E) has no value to take its codes from")
    return Feature(name=name, type="nominal", lower=float(present.min()), upper=float(present.max()))


def _numeric_feature(col: np.ndarray, name: str, code: str, whole_floats_as_integers: bool,
                     path: object) -> Feature:
    """The feature of a numeric column under its type code ('' when the file has none)."""
    present = col[np.isfinite(col)]
    whole = bool(np.all(present == np.round(present)))
    zero_one = bool(np.all((present == 0) | (present == 1)))
    if code == "B":
        if not zero_one:
            bad = present[(present != 0) & (present != 1)][0]
            raise SchemaError(f"{path}: column {name!r} is coded B (binary) but holds {bad:g}")
        ftype = "binary"
    elif code == "D":
        if not whole:
            bad = present[present != np.round(present)][0]
            raise SchemaError(f"{path}: column {name!r} is coded D (discrete) but holds {bad:g}")
        ftype = "integer"
    elif code == "F":
        ftype = "integer" if (whole_floats_as_integers and present.size) and whole else "continuous"
    else:  # plain CSV: infer
        if present.size and zero_one:
            ftype = "binary"
        elif present.size and whole:
            ftype = "integer"
        else:
            ftype = "continuous"
    if ftype == "binary":
        return Feature(name=name, type=ftype, lower=0.0, upper=1.0)
    lo = float(present.min()) if present.size else None
    hi = float(present.max()) if present.size else None
    return Feature(name=name, type=ftype, lower=lo, upper=hi)


def load_csv(
    path: str | os.PathLike[str],
    target: str | None = None,
    *,
    require_target: bool = True,
    whole_floats_as_integers: bool = False,
    categories: str = "one-hot",
) -> Dataset:
    """Load a CSV (two-row header with type codes, or a plain header) with its schema.

    Parameters
    ----------
    path : path-like
    target : str, optional
        Label column; defaults to the ``T``-coded column, else ``Class``.
    require_target : bool
        When false and no label column is named or found, every column is a feature and
        ``y`` is ``None`` (``cfmaps build --data`` with a model that names its columns).
    whole_floats_as_integers : bool
        Declare ``F`` columns whose values are all whole numbers ``integer`` (Pima's
        counts, glucose and age are coded F): the schema the benchmarks use.
    categories : {"one-hot", "codes"}
        How ``E`` columns enter ``X``: one-hot encoded (a group of ``categorical``
        dummies), or one ``nominal`` column of codes ``min..max`` (for a model with
        categorical splits: LightGBM's ``categorical_feature``, XGBoost's
        ``enable_categorical``): the values themselves when all are non-negative integers,
        else each category's position among the sorted distinct values, as pandas'
        ``category`` dtype numbers a column of strings.

    Returns
    -------
    Dataset
        ``X`` of shape (n_samples, n_features), with ``E`` columns one-hot encoded or
        kept as codes.

    Raises
    ------
    SchemaError
        Unreadable or malformed file (see :func:`read_table`), no label column, a label
        other than the ``T``-coded column asked for, a missing or infinite label, a
        non-numeric or infinite value in a numeric column, a value its type code forbids
        (a 2 in a ``B`` column, 1.5 in a ``D`` column), or an unknown ``categories``.
    """
    if categories not in ("one-hot", "codes"):
        raise SchemaError(f"categories must be 'one-hot' or 'codes', got {categories!r}")
    names, coded, body = read_table(path)
    codes = coded or [""] * len(names)
    first_line = 3 if coded else 2
    if target is None:
        if codes.count("T") > 1:
            raise SchemaError(f"{path}: more than one column is coded T")
        target = names[codes.index("T")] if "T" in codes else "Class"
        if target not in names and not require_target:
            target = None
    if target is not None and target not in names:
        raise SchemaError(f"{path}: no label column {target!r}; columns are {names}")
    declared = [n for n, c in zip(names, codes, strict=True) if c == "T" and n != target]
    if declared:  # it would become a feature: the file's own label as an input
        raise SchemaError(f"{path}: the label asked for is {target!r}, but the type row "
                          f"codes {declared[0]!r} T (the label); code it as a feature "
                          "(B, D, F or E) or drop it")
    ti = names.index(target) if target is not None else -1
    y = _labels([r[ti] for r in body], names[ti], first_line, path) if target is not None else None
    cols: list[np.ndarray] = []
    feats: list[Feature] = []
    for j, name in enumerate(names):
        if j == ti:
            continue
        raw = [r[j] for r in body]
        if codes[j] == "E" and categories == "one-hot":
            ecols, efeats = _one_hot(raw, name)
            cols += ecols
            feats += efeats
            continue
        if codes[j] == "E":
            col = _codes(raw)
            cols.append(col)
            feats.append(_nominal_feature(col, name, path))
            continue
        col = _numbers(raw, name, first_line, path)
        cols.append(col)
        feats.append(_numeric_feature(col, name, codes[j], whole_floats_as_integers, path))
    X = np.column_stack(cols) if cols else np.zeros((len(body), 0))
    return Dataset(X=X, y=y, schema=FeatureSchema(tuple(feats)), target=target)
