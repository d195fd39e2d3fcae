#!/bin/sh
# The mutation run, in one command (docs/development.md, "Mutation testing"):
#   scripts/mutation.sh [--fresh | --missed | --resume | --sample N [--seed S] [--again]]
#                       [--jobs N] [SCOPE ...]
# SCOPE: core, state, identify, core/leases, observe/jobmap.py, ... (paths under patroller/);
# none: the whole scope of pyproject.toml's [tool.mutmut]. mutmut comes from the `mutation`
# extra, installed into .venv (made by tests/setup.sh) on the first run. --jobs (default 2, or
# MUTATION_JOBS): mutants tested at once. Prints the score of each package and every mutant
# not caught; scripts/mutation.py says the rest.
set -eu
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    echo "scripts/mutation.sh: no .venv here; run sh tests/setup.sh first" >&2
    exit 2
fi
if ! .venv/bin/python -c 'import mutmut' 2>/dev/null; then
    .venv/bin/pip install --quiet --disable-pip-version-check -e '.[test,mutation]'
fi
exec .venv/bin/python scripts/mutation.py run "$@"
