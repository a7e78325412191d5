#!/usr/bin/env bash
# Container smoke test: build the image, start it, wait for /readyz, upload a skops model with
# the admin token, get a counterfactual through the published port, check that the model
# predicts the target for it, restart the container and check the model is still served.
# Cleans up the container, its volume and temporary files on exit (the image is kept).
#
# Usage: bash scripts/container-smoke.sh
# Environment: CONTAINER_ENGINE (default: podman, else docker), SMOKE_IMAGE (cfmaps:smoke),
#              SMOKE_PORT (18000), SMOKE_TIMEOUT (seconds per wait, 180).
# Needs: the engine, curl and python3 on the host. With podman on a machine that cannot reach
# a registry, run `bash ../shared/tools/container-env.sh` once first.
set -euo pipefail
cd "$(dirname "$0")/.."

engine=${CONTAINER_ENGINE:-$(command -v podman || command -v docker || true)}
[ -n "$engine" ] || { echo "container-smoke: no podman or docker found" >&2; exit 2; }
image=${SMOKE_IMAGE:-cfmaps:smoke}
port=${SMOKE_PORT:-18000}
timeout=${SMOKE_TIMEOUT:-180}
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

step "run on 127.0.0.1:$port"
"$engine" run -d --name "$name" -p "127.0.0.1:$port:8000" -v "$volume:/data" \
    -e CFMAPS_ADMIN_TOKEN="$admin" -e CFMAPS_API_TOKENS="$api" "$image" >/dev/null

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

step "healthcheck and restart"
if [ "$(basename "$engine")" = podman ]; then
    "$engine" healthcheck run "$name" && echo "healthcheck: healthy"
fi
"$engine" restart "$name" >/dev/null
wait_ready
curl -fsS -H "Authorization: Bearer $api" "$base/v1/models/$id" | json 'd["status"]' \
    | grep -qx ready || fail "the model is not ready after a restart"
echo "after restart: model $id ready"

printf '\ncontainer smoke: OK\n'
