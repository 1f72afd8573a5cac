#!/usr/bin/env bash
# One command: set up everything and run the test suite.
# -v names each test as it starts and gives its result as it ends (the differential tests
# take a few minutes each); --durations lists the slowest at the end.
#
# Without arguments it runs the main suite, then tests/tpch (TPC-H against DuckDB, on a
# session with a larger driver) and tests/cluster (a Spark standalone cluster and an S3
# server on this machine), each in a pytest process of its own: PySpark allows one
# SparkContext per process. It fails if any run fails. With arguments it runs one pytest
# with them, e.g. `bash scripts/test.sh tests/cluster`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# tests/console drive Debian's headless Chromium: as root with apt-get (as CI runs), install
# it when missing, quietly; elsewhere those tests skip and say why.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing chromium and chromium-driver (Debian) for the console's browser tests" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } \
      >/dev/null 2>&1 || echo "test.sh: could not install chromium; the console's browser tests will skip" >&2
  fi
fi
if [[ $# -gt 0 ]]; then
  exec .venv/bin/python -m pytest -v --durations=20 "$@"
fi
main=0
.venv/bin/python -m pytest -v --durations=40 || main=$?
tpch=0
.venv/bin/python -m pytest -v --durations=5 tests/tpch || tpch=$?
cluster=0
.venv/bin/python -m pytest -v --durations=10 tests/cluster || cluster=$?
if [[ $main -ne 0 ]]; then
  echo "test.sh: the main suite failed (pytest exit status $main)" >&2
  exit "$main"
fi
if [[ $tpch -ne 0 ]]; then
  echo "test.sh: tests/tpch failed (pytest exit status $tpch)" >&2
  exit "$tpch"
fi
exit "$cluster"
