#!/usr/bin/env bash
# Install (into ./.venv) and run the default evolution job; extra arguments go to `evolve run`.
source "$(dirname "$0")/_venv.sh"
exec .venv/bin/evolve run "$@"
