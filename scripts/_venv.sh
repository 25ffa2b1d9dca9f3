# Sourced by the scripts beside it: make ./.venv (Python 3.11) and install the project into it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "error: pallas-evolve needs Python 3.11 ($PYTHON is $("$PYTHON" -V 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 2
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
target="."
[ -n "${EXTRAS:-}" ] && target=".[${EXTRAS}]"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$target"
