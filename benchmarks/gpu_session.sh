#!/usr/bin/env bash
# Every GPU figure of docs/benchmarks.md in one command, for a lent accelerator
# machine (its own python3 with JAX and Flax; polyjit from this checkout):
#
#     bash benchmarks/gpu_session.sh [OUT]      # OUT: where results go ($OUT or /tmp/gpu)
#
# Each part runs under its own time limit and writes its output as it goes, so a
# part that runs long leaves the others' figures intact. In order of need: the
# accelerator benchmark (issue 40's table), the hot call, packing (issue 41's
# step against hand-packed segment ids), the accelerator-path tests on a real
# device.
set -u
OUT=${1:-${OUT:-/tmp/gpu}}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Processes run one after another; without this each would take 75% of the card.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=${PY:-python3}

part() {  # part NAME SECONDS COMMAND...: one part, its output in $OUT/NAME.txt
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s) $(date -u +%H:%M:%S)"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  echo "=== $name: exit $? after $((SECONDS - t0))s"
  tail -n 25 "$OUT/$name.txt"
}

{ nvidia-smi -L; $PY -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"; } 2>&1 | tee "$OUT/env.txt"
part accelerator 200 $PY benchmarks/accelerator.py --json "$OUT/accelerator.json"
part hot_call 80 $PY benchmarks/hot_call.py
part packing 170 $PY benchmarks/packing.py --steps 16 --repeats 3 --out "$OUT/packing.json"
part tests 60 $PY -m pytest -q -p no:cacheprovider -x tests/test_accelerator_path.py tests/test_jit_hot_path.py tests/test_device_placement_committed.py
