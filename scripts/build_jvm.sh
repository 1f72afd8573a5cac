#!/usr/bin/env bash
# Build factflow/jvm/factflow-jvm.jar from factflow/jvm/src against the pinned PySpark's jars
# (needs a JDK 17+: javac and jar). The jar is committed, so installing factflow needs only a
# Java runtime; run this after changing the Java source (tests/test_bound_rows.py checks it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
jars="$("$PY" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
javac --release 17 -nowarn -d "$out" -cp "$jars/*" $(find factflow/jvm/src -name '*.java')
# the jar records the digest of its source (tests/test_bound_rows.py compares it)
mkdir -p "$out/factflow/jvm"
"$PY" -c 'import sys; sys.path.insert(0, "."); from factflow.arrangement.bound import source_digest; print(source_digest())' \
  > "$out/factflow/jvm/source.sha256"
# fixed timestamps: the same source gives the same jar
find "$out" -exec touch -d "2000-01-01 00:00:00 UTC" {} +
(cd "$out" && jar --create --file factflow-jvm.jar --no-manifest --date 2000-01-01T00:00:02Z $(find . -type f | sort))
mv "$out/factflow-jvm.jar" factflow/jvm/factflow-jvm.jar
echo "built factflow/jvm/factflow-jvm.jar"
