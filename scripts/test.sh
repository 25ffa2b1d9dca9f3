#!/usr/bin/env bash
# Install (into ./.venv) and run the test suite: lint, then the fast tests (slow ones: -m slow).
EXTRAS=test source "$(dirname "$0")/_venv.sh"
.venv/bin/ruff check evolve mutations seeds evaluator archive mlflow_runs tests examples
exec .venv/bin/python -m pytest -q "$@"
