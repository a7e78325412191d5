from __future__ import annotations

import errno
import json
import os
import stat
import threading

import numpy as np
import pytest
from sklearn.ensemble import RandomForestClassifier

from maps_core import (
    DEFAULT_MAX_RECTANGLES,
    ArtifactError,
    ArtifactNotFoundError,
    BudgetExceededError,
    BuildOptionsError,
    CorruptArtifactError,
    CounterfactualMaps,
    IncompatibleArtifactError,
    InvalidQueryError,
    check_save_path,
)
from maps_core._memory import bytes_per_box
from tests.conftest import fit, region_end_points, synthetic


@pytest.fixture(scope="module")
def built():
    model, X, _ = fit("rf", 3, n_features=5, seed=2)
    return model, X, CounterfactualMaps.build(model)


def answers(maps, X, norm="l2"):
    return [(r.prediction, r.best.distance, tuple(r.best.x)) for r in maps.counterfactuals(X, norm=norm)]


def test_round_trip_gives_identical_answers(built, tmp_path):
    model, X, maps = built
    path = maps.save(tmp_path / "m")
    loaded = CounterfactualMaps.load(path)
    assert loaded.fingerprint == maps.fingerprint
    assert loaded.classes == maps.classes and loaded.feature_names == maps.feature_names
    assert loaded.stats.bytes_on_disk > 0
    assert isinstance(loaded.partition.lo.base, np.memmap)  # a view of the mapped file
    for norm in ("l1", "l2", "linf"):
        assert answers(loaded, X[:40], norm) == answers(maps, X[:40], norm)
    assert np.array_equal(loaded.predict(X), model.predict(X))


def test_save_replaces_atomically_and_leaves_no_temporaries(built, tmp_path):
    _, _, maps = built
    maps.save(tmp_path / "m")
    maps.save(tmp_path / "m")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_save_replaces_only_maps(built, tmp_path):
    """A save replaced whatever was at its path: a project folder, a file, the model file."""
    _, _, maps = built
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "code.py").write_text("precious")
    model_file = tmp_path / "model.skops"
    model_file.write_bytes(b"PK model")
    link = tmp_path / "link"
    link.symlink_to(project)
    for target in (project, model_file, link, project / "src" / "code.py"):
        with pytest.raises(ArtifactError, match="maps replace only maps"):
            maps.save(target)
    assert (project / "src" / "code.py").read_text() == "precious"
    assert model_file.read_bytes() == b"PK model" and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "model.skops", "project"]
    # under a file: was a FileExistsError after the build; an ArtifactError now, from the
    # check that the CLI makes before building too
    for target in (model_file / "maps", model_file / "a" / "b"):
        with pytest.raises(ArtifactError, match="is a file"):
            check_save_path(target)
        with pytest.raises(ArtifactError, match="is a file"):
            maps.save(target)
    assert model_file.read_bytes() == b"PK model"
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "empty", tmp_path / "new", tmp_path / "new"):  # new, then maps
        maps.save(target)
        assert CounterfactualMaps.load(target).stats.rectangles == maps.stats.rectangles


def test_save_without_parents_needs_the_folder(built, tmp_path):
    _, _, maps = built
    with pytest.raises(FileNotFoundError):
        maps.save(tmp_path / "gone" / "maps", parents=False)
    assert list(tmp_path.iterdir()) == []  # the folder was not brought back
    maps.save(tmp_path / "new" / "maps")  # the default makes it
    CounterfactualMaps.load(tmp_path / "new" / "maps")


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "version", "manifest", "shape",
                                    "swapped", "nested", "huge-int"])
def test_damaged_artifacts_are_refused(built, tmp_path, damage):
    _, _, maps = built
    path = maps.save(tmp_path / "m")
    target = path / "partition.lo.npy"
    manifest = json.loads((path / "manifest.json").read_text())
    if damage == "flip":
        b = bytearray(target.read_bytes())
        b[-3] ^= 0xFF
        target.write_bytes(bytes(b))
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:-16])
    elif damage == "delete":
        target.unlink()
    elif damage == "version":
        manifest["format_version"] = 999
        (path / "manifest.json").write_text(json.dumps(manifest))
    elif damage == "manifest":
        (path / "manifest.json").write_text("{not json")
    elif damage == "shape":
        manifest["arrays"]["partition.lo"]["shape"] = [1, 1]
        (path / "manifest.json").write_text(json.dumps(manifest))
    elif damage == "swapped":
        # two entries of one dtype and shape swapped with their checksums: the arrays'
        # table is not in the content digest, and the maps loaded and answered wrongly
        a = manifest["arrays"]
        a["partition.lo"], a["partition.hi"] = a["partition.hi"], a["partition.lo"]
        (path / "manifest.json").write_text(json.dumps(manifest))
    elif damage == "nested":  # a raw RecursionError
        (path / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    elif damage == "huge-int":  # a raw ValueError (integer string conversion limit)
        (path / "manifest.json").write_text('{"format": ' + "9" * 5000 + "}")
    expected = IncompatibleArtifactError if damage == "version" else CorruptArtifactError
    with pytest.raises(expected):
        CounterfactualMaps.load(path)


@pytest.mark.parametrize("edit", ["integer", "weight", "mutable", "view32", "classes"])
def test_edited_manifest_entries_are_refused(built, tmp_path, edit):
    """The schema and grid entries of the manifest decide answers as much as the arrays:
    a feature turned integer with a lower bound loaded silently, and answered with a
    value neither integral nor above that bound."""
    _, _, maps = built
    path = maps.save(tmp_path / "m")
    CounterfactualMaps.load(path)  # as saved: read back
    manifest = json.loads((path / "manifest.json").read_text())
    if edit == "integer":
        manifest["schema"][0].update(type="integer", lower=3)
    elif edit == "weight":
        manifest["schema"][0]["weight"] = 1000.0
    elif edit == "mutable":
        manifest["schema"][1]["mutable"] = False
    elif edit == "view32":
        manifest["grid"]["view32"] = not manifest["grid"]["view32"]
    else:
        manifest["model"]["classes"] = manifest["model"]["classes"][::-1]
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CorruptArtifactError):
        CounterfactualMaps.load(path)


def test_a_manifest_with_a_byte_order_mark_loads(built, tmp_path):
    _, X, maps = built
    path = maps.save(tmp_path / "m")
    manifest = path / "manifest.json"
    manifest.write_bytes(b"\xef\xbb\xbf" + manifest.read_bytes())  # saved by an editor
    assert answers(CounterfactualMaps.load(path), X[:5]) == answers(maps, X[:5])


def test_saved_maps_take_the_umask_s_mode(built, tmp_path):
    """tempfile.mkdtemp made the directory 0700 whatever the umask: maps a builder saved
    could not be loaded by another user (a replica's service account)."""
    _, _, maps = built
    old = os.umask(0o022)
    try:
        path = maps.save(tmp_path / "m")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o755


def test_a_parent_that_refuses_writes_is_an_artifact_error(built, tmp_path, monkeypatch):
    # (the permission itself cannot be tested as root, which the CI container may be)
    _, _, maps = built

    def refuse(path, mode=0o777):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "mkdir", refuse)
    with pytest.raises(ArtifactError, match="cannot write in .*Permission denied"):
        maps.save(tmp_path / "m", parents=False)


def test_saves_and_loads_of_one_path_at_once(built, tmp_path):
    """A save replaces maps in two renames: a load between them found nothing
    (ArtifactNotFoundError) or files gone (CorruptArtifactError), and two saves at once
    failed with a raw "Directory not empty" or refused each other's maps."""
    _, X, maps = built
    path = maps.save(tmp_path / "m")
    want = answers(maps, X[:3])
    errors: list[BaseException] = []
    loads = [0]
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                assert answers(CounterfactualMaps.load(path), X[:3]) == want
                loads[0] += 1
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)

    def save() -> None:
        for _ in range(100):
            try:
                maps.save(path)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

    threads = [threading.Thread(target=load), threading.Thread(target=save),
               threading.Thread(target=save)]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join()
    stop.set()
    threads[0].join()
    assert errors == [] and loads[0] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_maps_moved_aside_while_the_path_is_checked_are_no_refusal(built, tmp_path,
                                                                    monkeypatch):
    """Another save moves the maps aside (:func:`_swap_in`) just after the check saw them:
    the path then exists no more, and read as "a file", refusing the save (seen in CI)."""
    _, _, maps = built
    path = maps.save(tmp_path / "m")
    real = os.path.lexists
    moved = []

    def lexists(p):  # noqa: ANN001 - os.path.lexists's own signature
        there = real(p)
        if there and os.fspath(p) == os.fspath(path) and not moved:
            os.replace(path, tmp_path / ".m.old-x")  # what _swap_in does
            moved.append(True)
        return there

    monkeypatch.setattr(os.path, "lexists", lexists)
    check_save_path(path)
    assert moved


def test_missing_artifact(tmp_path):
    with pytest.raises(ArtifactNotFoundError):
        CounterfactualMaps.load(tmp_path / "nothing")


def test_builds_stop_at_the_default_rectangle_budget(built):
    """Without a size budget a build certifies about DEFAULT_MAX_RECTANGLES and keeps the
    rest mixed (a 30-tree forest of depth 6 on 6 features has many more); None lifts the
    limit, and a model within it gets complete maps either way."""
    from sklearn.datasets import make_classification

    X, y = make_classification(2000, 6, n_informative=4, random_state=0)
    big = RandomForestClassifier(30, max_depth=6, random_state=0).fit(X, y)
    maps = CounterfactualMaps.build(big, n_jobs=1)
    assert 0.99 * DEFAULT_MAX_RECTANGLES <= maps.stats.rectangles <= DEFAULT_MAX_RECTANGLES
    assert maps.stats.mixed_regions > 0
    model, _, small = built
    assert small.stats.mixed_regions == 0
    unlimited = CounterfactualMaps.build(model, max_rectangles=None)
    assert unlimited.stats.rectangles_per_class == small.stats.rectangles_per_class


@pytest.mark.parametrize("n_jobs", [1, 2])
@pytest.mark.parametrize("budget", [1, 3, 50, 300])
def test_the_rectangle_budget_holds_exactly(built, budget, n_jobs):
    """The budget was checked only between work items (of up to 2,000 regions each): a
    budget of 3 certified 116 rectangles, of 300 certified 1,103. The maps stay exact, and
    do not depend on the threads' timing."""
    model, X, full = built
    maps = CounterfactualMaps.build(model, max_rectangles=budget, n_jobs=n_jobs)
    assert maps.stats.rectangles <= budget and maps.stats.mixed_regions > 0
    again = CounterfactualMaps.build(model, max_rectangles=budget, n_jobs=2).partition
    for a, b in ((maps.partition.lo, again.lo), (maps.partition.hi, again.hi),
                 (maps.partition.labels, again.labels)):
        assert np.array_equal(a, b)
    P = np.random.default_rng(budget).normal(scale=2, size=(5000, X.shape[1]))
    assert np.array_equal(maps.predict(P), model.predict(P))
    assert answers(maps, X[:5], "l1") == answers(full, X[:5], "l1")


def test_budget_error_mode(built):
    model, _, _ = built
    with pytest.raises(BudgetExceededError, match="rectangle budget"):
        CounterfactualMaps.build(model, max_rectangles=5, on_budget="error")


@pytest.mark.parametrize("option", [{"on_budget": "raise"}, {"on_budget": None},
                                    {"max_rectangles": 0}, {"max_rectangles": -1},
                                    {"max_rectangles": 2.5}, {"max_rectangles": True},
                                    {"max_memory": 0}, {"max_seconds": -1.0},
                                    {"max_seconds": float("nan")}, {"max_seconds": "1"}])
def test_malformed_build_options_are_refused(built, option):
    model, _, _ = built
    with pytest.raises(BuildOptionsError, match=next(iter(option))):
        CounterfactualMaps.build(model, **option)


def test_mixed_regions_keep_answers_exact_and_faithful(built, tmp_path):
    model, X, full = built
    seen: list[float] = []
    part = CounterfactualMaps.build(model, max_rectangles=5, progress=seen.append)
    assert part.stats.mixed_regions > 0
    assert seen and all(0.0 <= s <= 1.0 for s in seen) and seen == sorted(seen)
    rng = np.random.default_rng(0)
    P = np.vstack([X, rng.normal(scale=2, size=(20000, X.shape[1]))])
    assert np.array_equal(part.predict(P), model.predict(P))
    loaded = CounterfactualMaps.load(part.save(tmp_path / "mixed"))
    for norm in ("l1", "l2", "linf"):
        for a, b, c in zip(loaded.counterfactuals(X[:30], norm=norm),
                           full.counterfactuals(X[:30], norm=norm),
                           loaded.counterfactuals(X[:30], norm=norm, k=3), strict=True):
            assert a.best.distance == pytest.approx(b.best.distance, abs=1e-12)
            assert model.predict(a.best.x[None])[0] == a.target
            assert c.best.distance == pytest.approx(b.best.distance, abs=1e-12)
    assert any(r.stats.regions_refined > 0 for r in loaded.counterfactuals(X[:30]))


@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
def test_mixed_search_matches_complete_maps(budgeted, norm, deepening):
    """The search inside mixed regions finds the complete build's optimum, for forests and
    boosting, two and three classes, whatever the deepening schedule."""
    model, X, full, part = budgeted
    assert part.stats.mixed_regions > 0
    refined = 0
    for x in X[:25]:
        got = part.counterfactual(x, norm=norm)
        want = full.counterfactual(x, norm=norm)
        refined += got.stats.regions_refined
        assert got.best.distance == pytest.approx(want.best.distance, abs=1e-12)
        assert model.predict(got.best.x[None])[0] == got.target
    assert refined > 0


def test_query_budget_in_mixed_regions(budgeted):
    """A query that would pop more mixed-region boxes than its ``max_boxes`` allows fails
    with BudgetExceededError (the service's 422 budget_exceeded), not a generic error; the
    ones that fit give the same exact answers as without the limit."""
    model, X, _, part = budgeted
    stuck = 0
    for x in X[:25]:
        free = part.counterfactual(x, norm="l2")
        try:
            r = part.counterfactual(x, norm="l2", max_boxes=1)
        except BudgetExceededError as exc:
            assert "more than 1 box of" in str(exc) and "max_boxes" in str(exc)
            assert free.stats.regions_refined > 1
            stuck += 1
        else:
            assert r.stats.regions_refined <= 1
            assert r.best.distance == free.best.distance
            assert model.predict(r.best.x[None])[0] == r.target
    assert stuck > 0


@pytest.mark.parametrize("option", ["max_boxes", "max_memory"])
@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "10"])
def test_query_budgets_must_be_positive_integers(budgeted, option, bad):
    _, X, _, part = budgeted
    with pytest.raises(InvalidQueryError, match=option) as exc:
        part.counterfactual(X[0], **{option: bad})
    assert exc.value.field == option


@pytest.mark.parametrize("option", [{"max_boxes": 2**63}, {"max_boxes": 10**20},
                                    {"max_boxes": np.uint64(2**64 - 1)},
                                    {"max_memory": 10**30}, {"max_seconds": 10**400}])
def test_query_budgets_past_int64_are_no_limit(budgeted, option):
    """A budget past the kernels' int64 counters is no limit in effect: a numba TypingError
    (10**20), an OverflowError, or at once "needed more than 9,223,372,036,854,775,808
    boxes" (2**63) before."""
    _, X, _, part = budgeted
    free = part.counterfactuals(X[:3])
    for got in (part.counterfactuals(X[:3], **option), [part.counterfactual(X[0], **option)]):
        assert [r.best.distance for r in got] == [r.best.distance for r in free[:len(got)]]
        assert all(r.optimal for r in got)


def test_a_cancel_that_is_no_event_is_refused(budgeted):
    _, X, _, part = budgeted
    with pytest.raises(InvalidQueryError, match="cancel must be a threading.Event") as exc:
        part.counterfactual(X[0], cancel="yes")
    assert exc.value.field == "cancel"


def test_a_build_time_limit_past_float64_is_no_limit(built):
    model, _, full = built
    maps = CounterfactualMaps.build(model, max_seconds=10**400, max_rectangles=None)
    assert maps.stats.rectangles_per_class == full.stats.rectangles_per_class


def test_query_memory_budget_bounds_the_boxes_held(budgeted, deepening):
    """``max_memory`` bounds the boxes a search holds at once (``peak_boxes``, each
    ``bytes_per_box`` bytes): a budget one box short of what a search held without it
    stops that search (BudgetExceededError naming ``max_memory``, or the best found,
    within the budget), and a budget with room for it plus one pop's slots gives the same
    search, box for box. Under every deepening schedule: the shipped one holds few boxes
    here, the others hold more than the box arrays' first 64 rows, so the arrays must
    grow within the budget. In one thread: box for box holds for a search in one part
    (parts share their bound as they go; see the test of searches in parts)."""
    model, X, full, part = budgeted
    eng = part.engine
    per_box = bytes_per_box(eng.grid.n_features, len(eng.kernel.roots), len(eng.classes))
    fo = eng.forest
    room = max(2, int((fo.kend - fo.kstart).max()))  # what one pop may take
    stopped = 0
    for x in X[:25]:
        free = part.counterfactual(x, norm="l1", threads=1)
        held = free.stats.peak_boxes
        if held == 0:
            continue
        same = part.counterfactual(x, norm="l1", threads=1, max_memory=(held + room) * per_box)
        assert same.best.distance == free.best.distance
        assert (same.stats.regions_refined, same.stats.peak_boxes) == (
            free.stats.regions_refined, held)
        # whatever the budget, a search that completes held no more boxes than it allows
        for boxes in range(max(1, held // 2), held + room + 1, max(1, held // 8)):
            try:
                within = part.counterfactual(x, norm="l1", threads=1, max_memory=boxes * per_box)
            except BudgetExceededError:
                continue
            assert within.stats.peak_boxes <= boxes
        short = (held - 1) * per_box + per_box - 1  # room for held - 1 boxes, not held
        with pytest.raises(BudgetExceededError, match="max_memory") as exc:
            part.counterfactual(x, norm="l1", threads=1, max_memory=short)
        assert f"more than {held - 1:,} box{'es' if held - 1 != 1 else ''} of" in str(exc.value)
        try:
            best = part.counterfactual(x, norm="l1", threads=1, max_memory=short, on_budget="best")
        except BudgetExceededError:
            pass  # it met no target box before it stopped
        else:
            assert best.stats.peak_boxes <= held - 1
            assert not best.optimal or best.best.distance == free.best.distance
            want = free.best.distance
            assert best.lower_bound <= want * (1 + 1e-12) <= best.best.distance * (1 + 1e-12)
            assert model.predict(best.best.x[None])[0] == best.target
        stopped += 1
    assert stopped > 0, "no search held a box: the test checks nothing"


def test_query_time_budget_in_mixed_regions(budgeted):
    """``max_seconds`` bounds each instance's search of mixed regions: with no time at all
    every search that has a mixed region to look at fails with BudgetExceededError naming
    the budget, one by one and in a batch; with time to spare, the answers are those
    without the limit."""
    model, X, _, part = budgeted
    free = part.counterfactuals(X[:25], norm="l2")
    assert any(r.stats.regions_refined > 0 for r in free)
    for x in X[:5]:
        with pytest.raises(BudgetExceededError, match="max_seconds") as exc:
            part.counterfactual(x, norm="l2", max_seconds=1e-9)
        assert "1e-09 s" in str(exc.value)
    with pytest.raises(BudgetExceededError, match="max_seconds"):
        part.counterfactuals(X[:25], norm="l2", max_seconds=1e-9)
    timed = part.counterfactuals(X[:25], norm="l2", max_seconds=600.0)
    for a, b in zip(timed, free, strict=True):
        assert a.best.distance == b.best.distance
        assert a.stats.regions_refined == b.stats.regions_refined


def test_a_long_search_stops_at_its_time_budget():
    """A search running well past ``max_seconds`` stops (the clock is read between boxes
    as well as between deepening rounds) and fails with BudgetExceededError."""
    X, y = synthetic(2, 8, 7)
    model = RandomForestClassifier(n_estimators=60, max_depth=7, random_state=0).fit(X, y)
    part = CounterfactualMaps.build(model, max_rectangles=5)
    free = part.counterfactuals(X[:40], norm="l1")
    # the longest search by its work, and its time as the least of three runs: by wall
    # time, a row paused on a busy machine could pass for the long one
    slow = max(range(40), key=lambda i: free[i].stats.regions_refined)
    seconds = min(part.counterfactual(X[slow], norm="l1").stats.seconds for _ in range(3))
    assert free[slow].stats.regions_refined > 1000, "the test needs a long search"
    with pytest.raises(BudgetExceededError, match="max_seconds"):
        part.counterfactual(X[slow], norm="l1", max_seconds=seconds / 20)


@pytest.mark.parametrize("bad", [0, -1.5, float("nan"), True, "10"])
def test_query_time_budget_must_be_a_positive_number(budgeted, bad):
    _, X, _, part = budgeted
    with pytest.raises(InvalidQueryError, match="max_seconds") as exc:
        part.counterfactual(X[0], max_seconds=bad)
    assert exc.value.field == "max_seconds"


def test_k_best_with_mixed_regions_are_distinct_and_exact(built, deepening):
    """A mixed region is indexed under every class: with the target omitted (several
    target classes) it is met more than once, yet it must be searched once, and the k
    best must be distinct boxes whose distances match the complete build's k best."""
    model, X, full = built
    part = CounterfactualMaps.build(model, max_rectangles=5)
    assert part.stats.mixed_regions > 0
    for x in X[:40]:
        got = part.counterfactual(x, k=5)
        want = full.counterfactual(x, k=5)
        boxes = [(tuple(c.region.lower), tuple(c.region.upper)) for c in got.counterfactuals]
        assert len(boxes) == len(set(boxes))
        d = [c.distance for c in got.counterfactuals]
        assert d == sorted(d)
        assert d[0] == pytest.approx(want.best.distance, abs=1e-12)
        for c in got.counterfactuals:
            assert model.predict(c.x[None])[0] == c.target


def test_progress_reaches_one(built):
    model, _, _ = built
    seen: list[float] = []
    CounterfactualMaps.build(model, progress=seen.append)
    assert seen[-1] == 1.0


def test_progress_reaches_one_only_once_the_maps_are_indexed(built, monkeypatch):
    """The extraction alone reported 1.0, and the KD-trees were built after it (a third of
    a budgeted loan forest's build), while a progress bar sat full. Now the trees report
    their share, and 1.0 comes once the maps are complete."""
    from maps_core import maps as maps_module

    model, _, _ = built
    seen: list[float] = []
    at_index: list[float] = []
    real = maps_module.build_index

    def watched(*args, **kwargs):
        at_index.extend(seen)
        return real(*args, **kwargs)

    monkeypatch.setattr(maps_module, "build_index", watched)
    CounterfactualMaps.build(model, progress=seen.append)
    assert at_index and max(at_index) < 1.0
    assert seen == sorted(seen) and seen[-1] == 1.0 and seen.count(1.0) == 1
    # each class's tree reports its share: all but the last between the extraction's and 1.0
    after = seen[len(at_index):]
    assert len(after) == len(model.classes_) == 3, (at_index, after)
    assert max(at_index) < after[0] and after[-2] < 1.0, (at_index, after)


def test_progress_follows_the_budget_that_ends_the_build(monkeypatch):
    """A budgeted forest certifies a small share of its grid, so progress as that share sat
    near 0 until the build ended; it follows the rectangle budget now."""
    from sklearn.datasets import make_classification

    from maps_core import partition

    monkeypatch.setattr(partition, "REPORT_SECONDS", 0.0)  # a report after every item
    X, y = make_classification(2000, 6, n_informative=4, random_state=0)
    big = RandomForestClassifier(30, max_depth=6, random_state=0).fit(X, y)
    seen: list[float] = []
    maps = CounterfactualMaps.build(big, max_rectangles=20_000, n_jobs=1, progress=seen.append)
    assert maps.stats.mixed_regions > 0
    assert seen[-1] == 1.0 and seen == sorted(seen)
    assert 0.5 < max(seen[:-1]) <= 1.0
    # the fifth report and the rectangles then: the share of the budget, not of the grid
    assert any(0.2 < v < 0.9 for v in seen[:-1])


def test_a_full_disk_while_saving_leaves_the_old_maps_and_no_temporaries(built, tmp_path, monkeypatch):
    _, X, maps = built
    path = maps.save(tmp_path / "m")
    before = answers(CounterfactualMaps.load(path), X[:5])
    real = np.save
    calls = [0]

    def save(file, arr, *a, **kw):
        calls[0] += 1
        if calls[0] > 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(file, arr, *a, **kw)

    monkeypatch.setattr(np, "save", save)
    with pytest.raises(OSError) as err:
        maps.save(tmp_path / "m")
    assert err.value.errno == errno.ENOSPC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    assert answers(CounterfactualMaps.load(path), X[:5]) == before


def test_a_failing_final_rename_leaves_the_old_maps_in_place(built, tmp_path, monkeypatch):
    # the old maps are moved aside before the new ones are renamed in: a failure of that
    # rename left them under a hidden .m.old-* name, the path empty
    _, X, maps = built
    path = maps.save(tmp_path / "m")
    before = answers(CounterfactualMaps.load(path), X[:5])
    real = os.replace

    def replace(src, dst):
        if ".tmp-" in str(src):
            raise OSError(errno.EIO, "Input/output error")
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError):
        maps.save(path)
    monkeypatch.setattr(os, "replace", real)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    assert answers(CounterfactualMaps.load(path), X[:5]) == before


@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
def test_best_found_brackets_the_optimum(budgeted, norm):
    """With ``on_budget="best"``, a search out of its box budget answers with the nearest
    certified target box it met: its point and region get the target, and the optimum of
    the complete maps lies between ``lower_bound`` and its distance. An answer marked
    optimal is the complete maps' answer; the batch path answers as the row-by-row one."""
    model, X, full, part = budgeted
    unproven = 0
    for max_boxes in (1, 4, 40):
        batch = part.counterfactuals(X[:25], norm=norm, max_boxes=max_boxes, on_budget="best")
        for x, got in zip(X[:25], batch, strict=True):
            want = full.counterfactual(x, norm=norm).best.distance
            one = part.counterfactual(x, norm=norm, max_boxes=max_boxes, on_budget="best")
            assert (one.best.distance, one.optimal, one.lower_bound) == (
                got.best.distance, got.optimal, got.lower_bound)
            cf = got.best
            assert model.predict(cf.x[None])[0] == got.target != got.prediction
            assert cf.region.contains(cf.x)
            edges = region_end_points(cf.region, cf.x)
            if len(edges):
                assert (model.predict(edges) == got.target).all()
            assert got.lower_bound <= want * (1 + 1e-12) <= cf.distance * (1 + 1e-12) + 1e-15
            assert cf.counterfactual_distance == pytest.approx(cf.distance, rel=1e-6, abs=1e-9)
            if got.optimal:
                assert cf.distance == pytest.approx(want, abs=1e-12)
                assert got.lower_bound == cf.distance
            else:
                assert got.stats.regions_refined >= max_boxes
                unproven += 1
    assert unproven > 0, "no search ran out of its budget: the test checks nothing"


def test_best_found_out_of_time_still_answers(budgeted):
    """Out of time before any mixed box (``max_seconds`` tiny), a best-found search still
    answers from the certified rectangles when the maps have one of the target class
    (the default raises, see test_query_time_budget_in_mixed_regions)."""
    model, X, full, part = budgeted
    answered = 0
    for x in X[:10]:
        want = full.counterfactual(x, norm="l1").best.distance
        try:
            got = part.counterfactual(x, norm="l1", max_seconds=1e-9, on_budget="best")
        except BudgetExceededError as exc:
            assert "max_seconds" in str(exc)
            continue
        answered += 1
        assert model.predict(got.best.x[None])[0] == got.target
        assert got.lower_bound <= want * (1 + 1e-12) <= got.best.distance * (1 + 1e-12) + 1e-15
    assert answered > 0


def test_best_found_with_k_gives_distinct_valid_boxes(built):
    model, X, full = built
    part = CounterfactualMaps.build(model, max_rectangles=100)
    unproven = 0
    for x in X[:20]:
        want = full.counterfactual(x).best.distance
        got = part.counterfactual(x, k=4, max_boxes=3, on_budget="best")
        if got.optimal:  # then all k are the complete maps' k best, not just the first
            assert [c.distance for c in got.counterfactuals] == pytest.approx(
                [c.distance for c in full.counterfactual(x, k=4).counterfactuals], abs=1e-12)
        unproven += not got.optimal
        boxes = [(tuple(c.region.lower), tuple(c.region.upper)) for c in got.counterfactuals]
        assert len(boxes) == len(set(boxes))
        d = [c.distance for c in got.counterfactuals]
        assert d == sorted(d)
        assert got.lower_bound <= want * (1 + 1e-12) <= d[0] * (1 + 1e-12) + 1e-15
        for c in got.counterfactuals:
            assert model.predict(c.x[None])[0] == c.target
    assert unproven > 0


def test_best_found_on_complete_maps_is_the_optimum(built):
    """Complete maps never stop early: every answer is optimal, lower bound included."""
    model, X, full = built
    for r in full.counterfactuals(X[:20], on_budget="best", max_boxes=1):
        assert r.optimal and r.lower_bound == r.best.distance


@pytest.mark.parametrize("bad", ["approximate", None, 1])
def test_on_budget_must_be_known(budgeted, bad):
    _, X, _, part = budgeted
    with pytest.raises(InvalidQueryError, match="on_budget") as exc:
        part.counterfactual(X[0], on_budget=bad)
    assert exc.value.field == "on_budget"


def test_best_found_that_met_nothing_says_so():
    """``on_budget="best"`` out of its budget before meeting any counterfactual (l0 makes
    no first guess; the maps are nearly all mixed) raises, and the message says that
    nothing was met rather than recommend on_budget='best' again; the same query without
    the option is told about it."""
    from sklearn.datasets import make_classification

    X, y = make_classification(2000, 8, n_informative=6, random_state=5)
    model = RandomForestClassifier(60, max_depth=8, random_state=0).fit(X, y)
    part = CounterfactualMaps.build(model, max_rectangles=50)
    query = {"norm": "l0", "max_boxes": 1, "immutable": ["x5", "x6", "x7"]}
    with pytest.raises(BudgetExceededError) as best:
        part.counterfactual(X[0], on_budget="best", **query)
    assert "before it met any counterfactual" in str(best.value)
    assert "on_budget" not in str(best.value)
    with pytest.raises(BudgetExceededError) as plain:
        part.counterfactual(X[0], **query)
    assert "on_budget='best' takes the best counterfactual" in str(plain.value)


def test_too_many_open_files_is_not_called_corrupt(built, tmp_path, monkeypatch):
    """A process out of file descriptors cannot map the arrays: the maps are fine, so the
    error says what to raise, and is no CorruptArtifactError."""
    from maps_core import ArtifactError, storage

    _, _, maps = built
    path = maps.save(tmp_path / "m")

    def out_of_descriptors(*a, **kw):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(storage.np, "load", out_of_descriptors)
    with pytest.raises(ArtifactError, match="too many open files") as err:
        CounterfactualMaps.load(path)
    assert not isinstance(err.value, CorruptArtifactError)
