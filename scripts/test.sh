#!/usr/bin/env bash
# Install (into ./.venv, with Ray for the Ray executor's tests) and run the test suite: lint, then the tests
# on every core, in tiers (tests/tiers.py, docs/testing.md): a module of the judge tier is skipped while
# nothing it reads has changed since tests/judged.json recorded it passing. --all: every module of it too.
# Slow tests (the default task's shape, long runs): -m slow.
EXTRAS=test,ray source "$(dirname "$0")/_venv.sh"
# The UI test drives a real Chromium. As root on Debian, install Debian's package if it is missing;
# elsewhere that one test is skipped and says why.
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 &&
    apt-get install -y -q chromium >/dev/null 2>&1; }) || echo "note: could not install chromium; the UI test will be skipped" >&2
fi
.venv/bin/ruff check evolve mutations seeds evaluator archive mlflow_runs tests examples scripts
tiers=1
if [ "${1:-}" = "--all" ]; then tiers=0; shift; fi
PALLAS_EVOLVE_TIERS=$tiers exec .venv/bin/python -m pytest -q --durations=25 -n "${TEST_WORKERS:-2}" \
  --dist loadfile "$@"
