#!/usr/bin/env bash
# One command: set up everything and run the test suite.
# -v names each test as it starts and gives its result as it ends (the differential tests
# take a few minutes each); --durations lists the slowest at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -v --durations=20 "$@"
