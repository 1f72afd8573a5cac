#!/usr/bin/env bash
# Set up factflow on a fresh machine: check Java 17+ and Python 3.10+, create .venv,
# install the pinned dependencies and factflow itself. Safe to run again (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "factflow setup: $*" >&2; exit 1; }

# Java 17+ is the only system dependency (Spark runs on the JVM).
JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"
if ! command -v "$JAVA" >/dev/null 2>&1; then
  fail "no Java runtime found. Install Java 17 or newer (e.g. 'sudo apt-get install openjdk-17-jre-headless',
or a build from https://adoptium.net), then put 'java' on your PATH or set JAVA_HOME, and run this again."
fi
java_version=$("$JAVA" -version 2>&1 | sed -n 's/.*version "\([0-9][0-9]*\)\(\.[0-9]*\)\{0,1\}.*/\1\2/p' | head -1)
java_major=${java_version%%.*}
[[ "$java_major" == "1" ]] && java_major=${java_version#1.}
if [[ -z "$java_major" || "$java_major" -lt 17 ]]; then
  fail "Java ${java_version:-of unknown version} found at $(command -v "$JAVA"), but factflow needs Java 17 or newer.
Install a newer JDK/JRE (e.g. 'sudo apt-get install openjdk-17-jre-headless') and set JAVA_HOME to it."
fi

PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null 2>&1 || fail "python3 not found; install Python 3.10 or newer."
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
  || fail "Python 3.10+ is needed, found $("$PYTHON" --version 2>&1)."

if [[ ! -x .venv/bin/python ]]; then
  echo "factflow setup: creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.factflow-installed
if [[ ! -f "$stamp" || requirements.lock -nt "$stamp" || pyproject.toml -nt "$stamp" ]]; then
  echo "factflow setup: installing pinned dependencies (requirements.lock)" >&2
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -r requirements.lock
  .venv/bin/python -m pip install --quiet --no-deps -e .
  touch "$stamp"
fi
echo "factflow setup: ready (Java $java_major, $(.venv/bin/python --version))" >&2
