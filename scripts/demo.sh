#!/usr/bin/env bash
# One command: set up everything and run the main demo (LDBC SNB persons and knows).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/factflow demo "$@"
