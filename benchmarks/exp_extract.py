import sys, time
sys.path.insert(0, "benchmarks")
from sklearn.ensemble import RandomForestClassifier
from maps_core.adapters import flatten_model
from maps_core.grid import Grid
from maps_core.partition import extract
from common import load
name, T, D = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
Xtr, Xte, ytr, yte, schema = load(name)
rf = RandomForestClassifier(T, max_depth=D, random_state=0).fit(Xtr, ytr)
ens = flatten_model(rf); grid = Grid.from_ensemble(ens, schema)
for spec in sys.argv[4:]:
    pb, ns = map(int, spec.split(":"))
    t = time.time()
    p = extract(ens, grid, max_seconds=60, n_jobs=2, prove_budget=pb, n_samples=ns)
    print(name, T, D, spec, f"{time.time()-t:.1f}s rects={p.n_rectangles} mixed={p.n_mixed}", {k: v for k, v in p.counters.items() if k in ('regions','certified_by_bound','certified_by_proof','proofs_refuted','proofs_unknown')}, flush=True)
