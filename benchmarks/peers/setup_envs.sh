#!/usr/bin/env bash
# Create or update the peers' virtual environments under benchmarks/.venvs/<peer>.
#
#   bash benchmarks/peers/setup_envs.sh                 # all peers: ocean dice treecf veritas
#   bash benchmarks/peers/setup_envs.sh treecf          # just one (or several)
#   bash benchmarks/peers/setup_envs.sh --check         # report only, change nothing
#   bash benchmarks/peers/setup_envs.sh --unpinned ...  # top-level names instead of the lock
#
# Idempotent: a venv whose interpreter fits and whose packages already match
# requirements-<peer>.lock is left alone; a venv on the wrong Python is re-created; otherwise
# the lock is (re-)installed. Packages come from PyPI through pip. The peers are never
# project dependencies, and benchmarks/.venvs/ is git-ignored.
#
#   peer    python   top-level packages (the lock pins everything, incl. scikit-learn 1.9.1,
#                    the project's version, so a forest re-trained with the same seed is the
#                    same forest -- the runners verify it)
#   ocean   >= 3.12  oceanpy (ConstraintProgrammingExplainer, OR-Tools CP-SAT)
#   dice    3.11     dice-ml
#   treecf  3.11     treecf (Rust core, wheels)
#   veritas 3.11     dtai-veritas (C++ core, wheels) and numpy only: run_veritas.py gets the
#                    trees as node arrays, so no scikit-learn there
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BENCH="$(dirname "$HERE")"
VENVS="${CFMAPS_PEER_VENVS:-$BENCH/.venvs}"
PYENV_ROOT="${PYENV_ROOT:-$HOME/.pyenv}"

CHECK=0
UNPINNED=0
PEERS=()
for a in "$@"; do
  case "$a" in
    --check) CHECK=1 ;;
    --unpinned) UNPINNED=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    ocean|dice|treecf|veritas) PEERS+=("$a") ;;
    *) echo "unknown argument: $a" >&2; exit 2 ;;
  esac
done
[ ${#PEERS[@]} -eq 0 ] && PEERS=(ocean dice treecf veritas)

say() { printf '[setup_envs] %s\n' "$*"; }

# wanted "major.minor" prefix per peer, and the minimum acceptable
py_series() { case "$1" in ocean) echo "3.12" ;; *) echo "3.11" ;; esac; }
top_level() {
  case "$1" in
    ocean) echo "oceanpy==2.0.7 scikit-learn==1.9.1" ;;
    dice) echo "dice-ml==0.12 scikit-learn==1.9.1" ;;
    treecf) echo "treecf==0.3.2 scikit-learn==1.9.1" ;;
    veritas) echo "dtai-veritas==0.3.1 numpy" ;;
  esac
}
import_check() {
  case "$1" in
    ocean) echo "import ocean, ortools, sklearn; from importlib.metadata import version as v; print('oceanpy', v('oceanpy'), 'ortools', ortools.__version__, 'sklearn', sklearn.__version__)" ;;
    dice) echo "import dice_ml, sklearn; from importlib.metadata import version as v; print('dice-ml', v('dice-ml'), 'sklearn', sklearn.__version__)" ;;
    treecf) echo "import treecf, treecf._treecf_core, sklearn; print('treecf', treecf.__version__, 'sklearn', sklearn.__version__)" ;;
    veritas) echo "import veritas, numpy; print('dtai-veritas', veritas.__version__, 'numpy', numpy.__version__)" ;;
  esac
}

# newest interpreter of a series: pyenv's first, then PATH
find_python() {
  local series="$1" cand=""
  if [ -d "$PYENV_ROOT/versions" ]; then
    cand="$(ls -d "$PYENV_ROOT/versions/$series".* 2>/dev/null | grep -E "/$series\.[0-9]+$" \
            | sort -t. -k3,3n | tail -1 || true)"
    if [ -n "$cand" ] && [ -x "$cand/bin/python" ]; then echo "$cand/bin/python"; return 0; fi
  fi
  if command -v "python$series" >/dev/null 2>&1; then command -v "python$series"; return 0; fi
  if [ "$series" = "3.12" ] && command -v python3.13 >/dev/null 2>&1; then command -v python3.13; return 0; fi
  return 1
}

venv_series() { "$1/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true; }

# exit 0 when every pin of the lock is installed at exactly that version
lock_matches() {
  "$1/bin/python" - "$2" <<'PY'
import re, sys
from importlib import metadata
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
have = {norm(d.metadata["Name"]): d.version for d in metadata.distributions()}
bad = []
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name, _, ver = line.partition("==")
    if have.get(norm(name)) != ver:
        bad.append(f"{name}=={ver} (have {have.get(norm(name))})")
if bad:
    print("  differs: " + ", ".join(bad[:8]) + (" ..." if len(bad) > 8 else ""))
    sys.exit(1)
PY
}

mkdir -p "$VENVS"
status=0
for peer in "${PEERS[@]}"; do
  venv="$VENVS/$peer"
  lock="$HERE/requirements-$peer.lock"
  series="$(py_series "$peer")"
  have="$( [ -x "$venv/bin/python" ] && venv_series "$venv" || true)"
  if [ "$CHECK" = 1 ]; then
    if [ -z "$have" ]; then say "$peer: missing ($venv)"; status=1; continue; fi
    if lock_matches "$venv" "$lock"; then say "$peer: python $have, matches $(basename "$lock")"
    else say "$peer: python $have, does NOT match $(basename "$lock")"; status=1; fi
    "$venv/bin/python" -c "$(import_check "$peer")" | sed "s/^/[setup_envs] $peer: /" || status=1
    continue
  fi
  py="$(find_python "$series")" || { say "$peer: no Python $series found (pyenv or PATH)"; status=1; continue; }
  if [ -n "$have" ] && [ "$have" != "$series" ]; then
    say "$peer: venv is on Python $have, wanted $series: re-creating"
    rm -rf "$venv"
    have=""
  fi
  if [ -z "$have" ]; then
    say "$peer: creating $venv with $py ($("$py" -V 2>&1))"
    "$py" -m venv "$venv"
  fi
  if [ "$UNPINNED" = 1 ]; then
    say "$peer: pip install $(top_level "$peer")"
    # shellcheck disable=SC2046
    "$venv/bin/python" -m pip install -q --disable-pip-version-check $(top_level "$peer") 2>&1 \
      | grep -v "is ignored: it is neither a file nor a directory" || true
  elif lock_matches "$venv" "$lock" >/dev/null; then
    say "$peer: up to date with $(basename "$lock"), nothing to install"
  else
    say "$peer: installing $(grep -vc '^#' "$lock") pinned packages from $(basename "$lock")"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$lock" 2>&1 \
      | grep -v "is ignored: it is neither a file nor a directory" || true
    lock_matches "$venv" "$lock" || { say "$peer: lock still not matched after install"; status=1; }
  fi
  if out="$("$venv/bin/python" -c "$(import_check "$peer")" 2>&1)"; then
    say "$peer: ok: $out"
  else
    say "$peer: import check FAILED: $out"; status=1
  fi
done
exit $status
