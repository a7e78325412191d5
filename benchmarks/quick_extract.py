import sys, time
from sklearn.ensemble import RandomForestClassifier
from maps_core import CounterfactualMaps, FeatureSchema
sys.path.insert(0, "benchmarks")
from common import load
for name in sys.argv[1].split(","):
    Xtr, Xte, ytr, yte, schema = load(name)
    T, D = int(sys.argv[2]), int(sys.argv[3])
    rf = RandomForestClassifier(T, max_depth=D, random_state=0).fit(Xtr, ytr)
    use = sys.argv[4] if len(sys.argv) > 4 else "schema"
    sch = schema if use == "schema" else None
    t = time.time()
    maps = CounterfactualMaps.build(rf, sch, max_seconds=float(sys.argv[5]) if len(sys.argv) > 5 else None)
    print(name, T, D, use, f"{time.time()-t:.2f}s", maps.stats.rectangles_per_class, maps.stats.mixed_regions, maps.stats.thresholds_per_feature, maps.stats.extra, flush=True)
