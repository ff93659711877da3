#!/usr/bin/env bash
# One shot on a GPU machine: install the carried wheels, run the CUDA tests,
# then the GPU benchmark (extra arguments go to bench_gpu.py). Everything it
# prints also lands in $OUT (the device tool brings that folder back).
#
#   benchmarks/gpu/fetch_wheels.sh              # here, once: fills .whl/
#   device run, carry [".whl"]:  bash benchmarks/gpu/run_on_device.sh
#
# PYTHON picks the interpreter (default python3), WHEELS the wheel folder.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
OUT=${OUT:-/tmp/asyncrl-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    SITE=$(mktemp -d)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$WHEELS"/*.whl || { echo "installing $WHEELS failed"; exit 1; }
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src:$PYTHONPATH"
"$PY" -c "import pydantic, yaml, transformers, torch; print('torch', torch.__version__, \
'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() \
else '')" || { echo "a package is missing: run benchmarks/gpu/fetch_wheels.sh and carry .whl"; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi | tee "$OUT/nvidia-smi.txt"
"$PY" -m pytest -q -p no:cacheprovider tests/gpu/test_cuda.py -rs -s 2>&1 | tee "$OUT/tests.log"
tests=${PIPESTATUS[0]}
"$PY" benchmarks/bench_gpu.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
bench=${PIPESTATUS[0]}
echo "tests exit $tests, benchmark exit $bench"
exit $(( tests || bench ))
