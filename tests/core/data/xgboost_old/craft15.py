"""Categorical fixtures of XGBoost 1.5 (tests/core/test_old_library_files.py), crafted.

XGBoost 1.5 trained categorical splits with ``gpu_hist`` only, so these files are written
by hand from two numeric models 1.5.2 saved (``templates/num15_bin.json`` and ``num15_multi.json``:
binary and three classes on two features), each tree made a 7-node tree whose root (and
sometimes its right child) splits on a category set. XGBoost 1.5.2 itself then loads each
file and predicts on a grid of codes, negative values, fractions and huge values (``pred``:
the class index its ``Booster.predict`` gives). Run in an environment with xgboost 1.5.2:

    python craft15.py
"""
import copy
import json

import numpy as np
import xgboost as xgb

assert xgb.__version__ == "1.5.2", xgb.__version__
BIN = json.load(open("templates/num15_bin.json"))
MULTI = json.load(open("templates/num15_multi.json"))
V = np.array([0, 1, 2, 3, 4, 5, 6, 7, 30, 31, 32, 33, 39, 40, 41, 62, 63, 64, 65, 100,
              -1, -0.5, -0.0, -1e-7, -0.99, -1.5, -2, 0.5, 0.999, 1.5, 2.5, 4.99, 5.5, 40.5,
              63.9, 2**24, 2**24 + 2, 2**31 - 128, 2**31, 2**32, 1e20, -1e20, -2**31],
             dtype=np.float32)
X = np.array([[a, b] for a in V for b in V], dtype=np.float32)


def cat_tree(t, sets, dl0, leaves, tid=0):
    """Root: category set sets[0] on x0; its children x1 < 5, or with two sets the right
    child a category set sets[1] on x1."""
    t = copy.deepcopy(t)
    t.update(id=tid, left_children=[1, 3, 5, -1, -1, -1, -1],
             right_children=[2, 4, 6, -1, -1, -1, -1], parents=[2147483647, 0, 0, 1, 1, 2, 2],
             split_indices=[0, 1, 1, 0, 0, 0, 0], split_conditions=[3.0, 5.0, 5.0, *leaves],
             default_left=[dl0] + [False] * 6)
    st, nodes, cats = [1, 0, 0, 0, 0, 0, 0], [0], list(sets[0])
    if len(sets) > 1:
        st[2] = 1
        nodes.append(2)
        cats += list(sets[1])
    t.update(split_type=st, categories_nodes=nodes,
             categories_segments=[0] + ([len(sets[0])] if len(sets) > 1 else []),
             categories_sizes=[len(s) for s in sets], categories=cats)
    t["tree_param"].update(num_nodes="7", num_feature="2")
    for k in ("loss_changes", "sum_hessian", "base_weights"):
        t[k] = [1.0] * 7
    return t


def save(name, doc, trees, groups):
    doc = copy.deepcopy(doc)
    doc["learner"]["attributes"] = {}
    m = doc["learner"]["gradient_booster"]["model"]
    m["trees"] = trees
    m["tree_info"] = groups  # the class each tree adds to
    m["gbtree_model_param"]["num_trees"] = str(len(trees))
    path = f"1.5.2_categorical_{name}.json"
    with open(path, "w") as f:
        json.dump(doc, f)
    b = xgb.Booster(model_file=path)
    p = b.predict(xgb.DMatrix(X))
    pred = (p > 0.5).astype(np.int64) if p.ndim == 1 else np.argmax(p, axis=1)
    np.savez(path[:-5] + ".npz", X=X.astype(np.float64), pred=pred)
    print(path, np.bincount(pred))


t0 = BIN["learner"]["gradient_booster"]["model"]["trees"][0]
save("two_sets", BIN, [cat_tree(t0, [[3, 31], [0, 7, 33]], True, (0.1, 0.2, 0.3, 0.4)),
                       cat_tree(t0, [[0, 2, 5]], False, (-0.5, -0.5, 0.5, 0.5), 1)], [0, 0])
# 1.5's gpu_hist shape: one category per node, NaN as the (unused) condition
one_hot = cat_tree(t0, [[0]], False, (-0.5, -0.5, 0.5, 0.5))
one_hot["split_conditions"][0] = float("nan")
save("one_hot_zero", BIN, [one_hot], [0])
m0 = MULTI["learner"]["gradient_booster"]["model"]["trees"][0]
save("multiclass", MULTI, [cat_tree(m0, [[0, 2, 5]], True, (0.1, -0.2, 0.3, -0.4), 0),
                           cat_tree(m0, [[1, 40]], False, (-0.3, 0.2, 0.5, 0.1), 1),
                           cat_tree(m0, [[0, 63], [4]], True, (0.2, 0.25, -0.1, 0.05), 2)],
     [0, 1, 2])
