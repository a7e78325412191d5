import sys, time
sys.path.insert(0, "benchmarks")
from sklearn.ensemble import RandomForestClassifier
from maps_core.adapters import flatten_model
from maps_core.grid import Grid
from maps_core.partition import extract
from common import load
name, T, D, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
Xtr, Xte, ytr, yte, schema = load(name)
rf = RandomForestClassifier(T, max_depth=D, random_state=0).fit(Xtr, ytr)
ens = flatten_model(rf); grid = Grid.from_ensemble(ens, schema)
print("cells per feature", grid.n_cells)
extract(flatten_model(RandomForestClassifier(2, max_depth=2, random_state=0).fit(Xtr, ytr)), grid, n_jobs=1)
for spec in sys.argv[5:]:
    pb, ns = map(int, spec.split(":"))
    t = time.time()
    p = extract(ens, grid, max_seconds=secs, n_jobs=1, prove_budget=pb, n_samples=ns)
    el = time.time()-t
    print(name, T, D, spec, f"{el:.1f}s rects={p.n_rectangles} mixed={p.n_mixed} rate={p.counters['regions']/el:.0f} reg/s", p.counters, flush=True)
