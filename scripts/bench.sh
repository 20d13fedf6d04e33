#!/usr/bin/env bash
# The bench command: set-up + build + bench/run.py (arguments are passed on).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
$PY bench/run.py "$@"
