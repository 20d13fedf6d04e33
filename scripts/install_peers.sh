#!/usr/bin/env bash
# Installs the bench's optional peer kernels from the wheels kept in bench/peers/wheels
# (git-ignored; fetched where there is a registry with
#   python3 -m pip download liger-kernel --no-deps -d bench/peers/wheels
# and carried to the GPU box, which has none). --no-deps --no-index: nothing is fetched;
# the peers need only torch and triton, which the box has. A wheel that does not install
# is reported and skipped: bench/run.py then prints n/a for that peer.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
shopt -s nullglob
wheels=(bench/peers/wheels/*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
  echo "install_peers: no wheels in bench/peers/wheels; the bench will print n/a for the peers"
  exit 0
fi
for w in "${wheels[@]}"; do
  out=$($PY -m pip install -q --no-deps --no-index "$w" 2>&1)
  rc=$?
  echo "$out" | grep -v -e "Running pip as the 'root'" -e '^$' || true
  if [ $rc -ne 0 ]; then echo "install_peers: $w did not install (skipped)"; fi
done
$PY - <<'PY'
import importlib.util
for name in ("liger_kernel", "flashinfer"):
    print(f"install_peers: {name}: {'importable' if importlib.util.find_spec(name) else 'absent'}")
PY
exit 0
