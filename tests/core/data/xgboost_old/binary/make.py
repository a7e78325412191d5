"""Regenerate XGBoost binary-format model files (``save_model`` to a name not ending in
``.json``/``.ubj``) for ``tests/app/test_modelio.py``: the service must name the format
whatever the file's first bytes. Run once per version, in a virtual environment holding
it (XGBoost 0.80 and 0.90 need Python 3.7 or 3.8; not run by CI), then rename the files
as they are here (``<version>_<kind>.model``):

    python make.py   # 0.80, 0.90, 1.0.2, 1.3.3, 1.6.2

Before 1.1 a file starts with its base score as a float32 (1.1 adds ``binf``); the
``*_magic`` files choose a base score whose bytes open as a pickle (``\\x80``) or a gzip
stream (``\\x1f\\x8b``) would.
"""
import os
import struct

import numpy as np
import xgboost as xgb

v = xgb.__version__
out = "v" + v.replace(".", "")
os.makedirs(out, exist_ok=True)
rng = np.random.RandomState(0)
old = v.startswith("0.")
for name, nf, params, k in [
    ("binary_logistic", 4, {"objective": "binary:logistic"}, 2),
    ("multi_softprob", 5, {"objective": "multi:softprob", "num_class": 3}, 3),
    ("regression", 6, {"objective": "reg:linear" if v == "0.80" else "reg:squarederror"}, None),
    ("dart", 4, {"objective": "binary:logistic", "booster": "dart"}, 2),
    ("gblinear", 4, {"objective": "binary:logistic", "booster": "gblinear"}, 2),
]:
    X = rng.rand(200, nf)
    y = rng.randint(0, k, 200) if k else rng.rand(200) * 3
    p = dict(params, max_depth=2, **({"silent": 1} if old else {}))
    xgb.train(p, xgb.DMatrix(X, label=y), 2).save_model(f"{out}/{name}.model")
# a base score whose float32 bytes are a pickle's or gzip's magic: binary:logistic stores
# the margin before 1.0, so search the probabilities around the logistic of that value
X, y = rng.rand(100, 4), rng.randint(0, 2, 100)
for tag, magic in (("pickle_magic", b"\x80\x00\x00\x3f"), ("gzip_magic", b"\x1f\x8b\x00\x3f")):
    m = struct.unpack("<f", magic)[0]
    for step in range(40):
        p = 1 / (1 + np.exp(-m)) + step * 1e-8
        b = xgb.train({"objective": "binary:logistic", "base_score": repr(p), "max_depth": 2},
                      xgb.DMatrix(X, label=y), 2)
        if bytes(b.save_raw())[:1] == magic[:1]:
            b.save_model(f"{out}/binary_logistic_{tag}.model")
            break
print(v, sorted(os.listdir(out)))
