#!/usr/bin/env bash
# Container smoke test: build the image, start it, wait for /readyz, upload a skops model with
# the admin token, get a counterfactual through the published port, check that the model
# predicts the target for it, kill an API worker and check that PID 1 reaps the processes it
# leaves (no zombies), restart the container and check the model is still served, then
# start the engine as an arbitrary UID (group 0) and with a read-only root file system and
# check that it loads the prebuilt JIT cache instead of compiling. Cleans up the
# containers, the volume and temporary files on exit (the image is kept).
#
# Usage: bash scripts/container-smoke.sh
# Environment: CONTAINER_ENGINE (default: podman, else docker), SMOKE_IMAGE (cfmaps:smoke),
#              SMOKE_PORT (18000), SMOKE_TIMEOUT (seconds per wait, 180), SMOKE_RUN_FLAGS
#              (more flags for the service's `run`, e.g. "--user 12345:0 --read-only --tmpfs /tmp").
# Needs: the engine, curl and python3 on the host. With podman on a machine that cannot reach
# a registry, run `bash ../shared/tools/container-env.sh` once first.
set -euo pipefail
cd "$(dirname "$0")/.."

engine=${CONTAINER_ENGINE:-$(command -v podman || command -v docker || true)}
[ -n "$engine" ] || { echo "container-smoke: no podman or docker found" >&2; exit 2; }
image=${SMOKE_IMAGE:-cfmaps:smoke}
port=${SMOKE_PORT:-18000}
timeout=${SMOKE_TIMEOUT:-180}
read -r -a run_flags <<<"${SMOKE_RUN_FLAGS:-}"
name=cfmaps-smoke-$$
volume=$name-data
admin=$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')
api=$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')
base=http://127.0.0.1:$port
tmp=$(mktemp -d)

cleanup() {
    status=$?
    if [ "$status" -ne 0 ] && "$engine" container inspect "$name" >/dev/null 2>&1; then
        echo "--- container logs (last 40 lines) ---" >&2
        "$engine" logs --tail 40 "$name" >&2 || true
    fi
    "$engine" rm -f "$name" >/dev/null 2>&1 || true
    "$engine" volume rm -f "$volume" >/dev/null 2>&1 || true
    rm -rf "$tmp"
    exit "$status"
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }
fail() { echo "container-smoke: FAILED: $*" >&2; exit 1; }
json() { python3 -c "import json, sys; d = json.load(sys.stdin); print($1)"; }

step "build $image with $(basename "$engine")"
build_flags=()
if [ "$(basename "$engine")" = podman ]; then
    # no registry here (base image built locally); docker format keeps the HEALTHCHECK
    build_flags+=(--pull=never --format docker)
fi
"$engine" build "${build_flags[@]}" -t "$image" .

step "run on 127.0.0.1:$port ${SMOKE_RUN_FLAGS:-}"
"$engine" run -d --name "$name" -p "127.0.0.1:$port:8000" -v "$volume:/data" \
    -e CFMAPS_ADMIN_TOKEN="$admin" -e CFMAPS_API_TOKENS="$api" ${run_flags[@]+"${run_flags[@]}"} \
    "$image" >/dev/null

wait_ready() {
    local deadline=$((SECONDS + timeout))
    until curl -fsS "$base/readyz" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || fail "/readyz not ready after ${timeout}s"
        "$engine" container inspect -f '{{.State.Running}}' "$name" 2>/dev/null | grep -q true \
            || fail "the container stopped"
        sleep 1
    done
}
wait_ready
echo "readyz: $(curl -fsS "$base/readyz")"

step "make a skops model inside the container"
"$engine" exec "$name" python -c "
import skops.io
from sklearn.datasets import make_classification
from sklearn.ensemble import RandomForestClassifier
X, y = make_classification(400, 4, n_informative=3, n_redundant=0, random_state=0)
m = RandomForestClassifier(20, max_depth=4, random_state=0).fit(X, y)
skops.io.dump(m, '/tmp/model.skops')
"
"$engine" cp "$name:/tmp/model.skops" "$tmp/model.skops"
ls -l "$tmp/model.skops"

step "management needs the admin token"
code=$(curl -s -o /dev/null -w '%{http_code}' -F "model=@$tmp/model.skops" "$base/v1/models")
[ "$code" = 401 ] || fail "upload without a token answered $code, expected 401"
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $api" \
    -F "model=@$tmp/model.skops" "$base/v1/models")
[ "$code" = 403 ] || fail "upload with an API token answered $code, expected 403"
echo "no token: 401, API token: 403"

step "upload with the admin token"
spec='{"name": "smoke", "features": [
  {"name": "a", "type": "continuous", "lower": -10, "upper": 10},
  {"name": "b", "type": "continuous", "lower": -10, "upper": 10},
  {"name": "c", "type": "continuous", "lower": -10, "upper": 10},
  {"name": "d", "type": "continuous", "lower": -10, "upper": 10, "mutable": false}]}'
curl -fsS -H "Authorization: Bearer $admin" -F "model=@$tmp/model.skops" -F "spec=$spec" \
    "$base/v1/models" >"$tmp/upload.json" || fail "upload: $(cat "$tmp/upload.json")"
id=$(json 'd["id"]' <"$tmp/upload.json")
echo "model id: $id"

step "wait for the build"
deadline=$((SECONDS + timeout))
while :; do
    curl -fsS -H "Authorization: Bearer $api" "$base/v1/models/$id" >"$tmp/status.json"
    status=$(json 'd["status"]' <"$tmp/status.json")
    [ "$status" = ready ] && break
    [ "$status" = failed ] && fail "build failed: $(cat "$tmp/status.json")"
    [ "$SECONDS" -lt "$deadline" ] || fail "build not ready after ${timeout}s"
    sleep 1
done
json '{k: d.get(k) for k in ("status", "progress", "stats")}' <"$tmp/status.json"

step "counterfactual through the published port"
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
    -d '{"instance": [0, 0, 0, 0]}' "$base/v1/models/$id/counterfactuals")
[ "$code" = 401 ] || fail "query without a token answered $code, expected 401"
curl -fsS -H "Authorization: Bearer $api" -H 'Content-Type: application/json' \
    -d '{"instance": {"a": 0.5, "b": -0.3, "c": 1.2, "d": 0.1}, "norm": "l2"}' \
    "$base/v1/models/$id/counterfactuals" >"$tmp/cf.json" || fail "query: $(cat "$tmp/cf.json")"
python3 -m json.tool "$tmp/cf.json"
target=$(json 'json.dumps(d["target"])' <"$tmp/cf.json")
cf=$(json 'json.dumps(d["counterfactual"])' <"$tmp/cf.json")
python3 -c "import json, sys; d = json.load(open(sys.argv[1])); \
assert d['optimal'] is True, 'not optimal'; assert d['distance'] > 0, 'zero distance'; \
assert abs(d['counterfactual']['d'] - 0.1) < 1e-6, 'the immutable feature d moved'" "$tmp/cf.json" \
    || fail "unexpected counterfactual answer"

step "the model predicts the target for the counterfactual"
curl -fsS -H "Authorization: Bearer $api" -H 'Content-Type: application/json' \
    -d "{\"instances\": [$cf]}" "$base/v1/models/$id/predict" >"$tmp/pred.json" \
    || fail "predict: $(cat "$tmp/pred.json")"
cat "$tmp/pred.json"; echo
got=$(python3 -c "import json, sys; d = json.load(open(sys.argv[1])); \
r = d.get('predictions', d.get('results', d.get('labels'))); r = r[0]; \
print(json.dumps(r.get('label', r.get('prediction')) if isinstance(r, dict) else r))" "$tmp/pred.json")
[ "$got" = "$target" ] || fail "predicted $got for the counterfactual, target was $target"
echo "prediction for the counterfactual: $got = target"

step "PID 1 reaps the processes a dead worker leaves"
# the API worker with the most descendants (the build ran in one: its forkserver lives on)
# is killed; its children are re-parented to PID 1, which must reap them as they exit
"$engine" exec "$name" python -c "
import os, signal, sys, time

def procs():
    out = {}
    for p in filter(str.isdigit, os.listdir('/proc')):
        try:
            st = dict(l.split(':', 1) for l in open(f'/proc/{p}/status') if ':' in l)
            argv = open(f'/proc/{p}/cmdline', 'rb').read().decode().split('\\0')
        except OSError:
            continue
        out[int(p)] = (int(st['PPid']), st['State'].strip()[0], argv)
    return out

ps = procs()
print('PID 1:', ' '.join(ps[1][2]))
serve = min(p for p, (_, _, a) in ps.items() if a[1:3] and a[1].endswith('cfmaps') and a[2] == 'serve')
workers = [p for p, (pp, _, a) in ps.items() if pp == serve and 'spawn_main' in ' '.join(a)]
def descendants(p):
    kids = [q for q, (pp, _, _) in ps.items() if pp == p]
    return kids + [d for k in kids for d in descendants(k)]
if not workers:  # CFMAPS_WORKERS=1: the one process is serve itself, nothing to kill
    print('one process (CFMAPS_WORKERS=1): no worker to kill')
    sys.exit(0)
victim = max(workers, key=lambda w: len(descendants(w)))
print(f'workers {workers}; killing {victim} and orphaning {descendants(victim)}')
os.kill(victim, signal.SIGKILL)
deadline = time.time() + 15
while True:
    time.sleep(1)
    zombies = {p: c for p, (pp, s, c) in procs().items() if s == 'Z' and pp == 1}
    if not zombies:
        break
    if time.time() > deadline:
        sys.exit(f'zombies left under PID 1: {zombies}')
print('no zombie under PID 1')
" || fail "zombie processes under PID 1"
wait_ready
curl -fsS -H "Authorization: Bearer $api" -H 'Content-Type: application/json' \
    -d '{"instance": {"a": 0.5, "b": -0.3, "c": 1.2, "d": 0.1}, "norm": "l2"}' \
    "$base/v1/models/$id/counterfactuals" >/dev/null || fail "no answer after a worker died"
echo "still answering"

step "every scrape of /metrics counts every worker, the killed one included"
# (with one process, trivially: its own count)
# two counterfactuals answered so far, by either worker; each scrape reaches one of them
totals=$(for _ in 1 2 3 4 5 6; do
    curl -fsS "$base/metrics" | python3 -c "import sys; print(sum(float(l.rsplit(' ', 1)[1]) \
for l in sys.stdin if l.startswith('cfmaps_counterfactuals_total ')))"
done | sort -u)
[ "$(printf '%s\n' "$totals" | wc -l)" = 1 ] || fail "scrapes disagree: $(echo $totals)"
python3 -c "import sys; assert float(sys.argv[1]) >= 2" "$totals" \
    || fail "cfmaps_counterfactuals_total $totals, 2 answered"
echo "cfmaps_counterfactuals_total $totals in every scrape"

step "healthcheck and restart"
if [ "$(basename "$engine")" = podman ]; then
    "$engine" healthcheck run "$name" && echo "healthcheck: healthy"
fi
"$engine" restart "$name" >/dev/null
wait_ready
curl -fsS -H "Authorization: Bearer $api" "$base/v1/models/$id" | json 'd["status"]' \
    | grep -qx ready || fail "the model is not ready after a restart"
echo "after restart: model $id ready"

step "the prebuilt JIT cache as an arbitrary UID and on a read-only root file system"
# group 0 may write the image's cache (as OpenShift runs containers); with a read-only root
# the engine copies it to /tmp first. Either way the kernels load, nothing is compiled.
warm='
import json, os, sys
from numba.core import config
from numba.core.registry import CPUDispatcher
from maps_core.warmup import warm_up
seconds = warm_up()
count = {"hits": 0, "misses": 0}
for name, mod in list(sys.modules.items()):
    if name.startswith("maps_core"):
        for f in vars(mod).values():
            if isinstance(f, CPUDispatcher):
                count["hits"] += sum(f.stats.cache_hits.values())
                count["misses"] += sum(f.stats.cache_misses.values())
print(json.dumps({"uid": os.getuid(), "cache": config.CACHE_DIR, "seconds": round(seconds, 1),
                  **count}))
assert count["misses"] == 0 and count["hits"] > 0, "compiled instead of loading the cache"
'
for flags in "--user 12345:0" "--user 12345:0 --read-only --tmpfs /tmp"; do
    # shellcheck disable=SC2086  # the flags are words
    "$engine" run --rm $flags -v "$volume:/data" "$image" python -c "$warm" \
        || fail "the warm-up with $flags"
done

printf '\ncontainer smoke: OK\n'
