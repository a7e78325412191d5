"""Shared helpers for the benchmarks: datasets, models and the schema a user would declare."""

from __future__ import annotations

import os
from pathlib import Path

from sklearn.model_selection import train_test_split

from maps_core import load_csv

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("CFMAPS_SHARED", ROOT.parent / "shared"))
DATASETS = {
    "BC": "Breast-Cancer-Wisconsin.csv",
    "CP": "COMPAS-ProPublica.csv",
    "FI": "FICO.csv",
    "PD": "Pima-Diabetes.csv",
}


def load(name: str, seed: int = 0):
    """(X_train, X_test, y_train, y_test, schema) with an 80/20 split."""
    # The schema a user would declare: the file's type codes, with F columns that only
    # hold whole numbers (Pima's counts, glucose, age...) declared integer.
    ds = load_csv(SHARED / "datasets" / DATASETS[name], whole_floats_as_integers=True)
    schema = ds.schema
    Xtr, Xte, ytr, yte = train_test_split(ds.X, ds.y, test_size=0.2, random_state=seed)
    return Xtr, Xte, ytr, yte, schema
