#!/usr/bin/env bash
# The test command: set-up + build + the whole suite (CUDA tests run where a GPU is).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
$PY -m pytest -q tests "$@"
