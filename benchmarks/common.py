"""Shared helpers for the benchmarks: datasets, models and the schema a user would declare."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
from sklearn.model_selection import train_test_split

from maps_core import FeatureSchema, load_csv

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("CFMAPS_SHARED", ROOT.parent / "shared"))
DATASETS = {
    "BC": "Breast-Cancer-Wisconsin.csv",
    "CP": "COMPAS-ProPublica.csv",
    "FI": "FICO.csv",
    "PD": "Pima-Diabetes.csv",
}


def declared_schema(schema: FeatureSchema, X: np.ndarray) -> FeatureSchema:
    """The schema a user would declare: the file's type codes, plus integer type for
    float-coded columns that only ever hold integers (Pima's counts, glucose, age...).
    Bounds are the observed range."""
    feats = []
    for j, f in enumerate(schema.features):
        if f.type == "continuous" and np.all(X[:, j] == np.round(X[:, j])):
            f = replace(f, type="integer")
        feats.append(f)
    return FeatureSchema(tuple(feats))


def load(name: str, seed: int = 0):
    """(X_train, X_test, y_train, y_test, schema) with an 80/20 split."""
    ds = load_csv(SHARED / "datasets" / DATASETS[name])
    schema = declared_schema(ds.schema, ds.X)
    Xtr, Xte, ytr, yte = train_test_split(ds.X, ds.y, test_size=0.2, random_state=seed)
    return Xtr, Xte, ytr, yte, schema
