"""Fixtures for the HTTP service tests: seeded small models and app/client factories."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
from svc_helpers import Fitted, Service, start_service


@pytest.fixture(scope="session")
def rf() -> Fitted:
    """Binary random forest on 5 continuous features (x0..x4)."""
    X, y = make_classification(300, 5, n_informative=3, n_redundant=0, random_state=0)
    model = RandomForestClassifier(10, max_depth=3, random_state=0).fit(X, y)
    return Fitted(model, X, y)


@pytest.fixture(scope="session")
def gb3() -> Fitted:
    """Three-class gradient boosting with string labels and integer-valued features."""
    rng = np.random.default_rng(1)
    X = np.column_stack(
        [
            rng.integers(0, 50, 400),
            rng.integers(0, 2, 400),
            rng.normal(0, 1, 400),
            rng.integers(18, 80, 400),
        ]
    ).astype(float)
    score = X[:, 0] / 10 + 2 * X[:, 1] + X[:, 2]
    y = np.array(["low", "mid", "high"])[np.digitize(score, [2.5, 5.0])]
    model = GradientBoostingClassifier(n_estimators=8, max_depth=2, random_state=0).fit(X, y)
    return Fitted(model, X, y)


@pytest.fixture
def service_factory(tmp_path: Path) -> Callable[..., Any]:
    """``with service_factory(**settings) as svc:`` -> a started :class:`Service`
    (data dir ``tmp_path / "data"`` unless ``data_dir`` is given)."""

    def make(data_dir: Path | None = None, **kw: Any) -> Any:
        return start_service(data_dir or tmp_path / "data", **kw)

    return make


@pytest.fixture
def service(service_factory: Callable[..., Any]) -> Iterator[Service]:
    """A default service (no tokens, loopback client). Bugs raise instead of answering 500."""
    with service_factory() as svc:
        yield svc


@pytest.fixture
def rf_service(service: Service, rf: Fitted) -> tuple[Service, str]:
    """The default service with the random forest uploaded and built."""
    return service, service.add(rf.skops)
