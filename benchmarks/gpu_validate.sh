#!/usr/bin/env bash
# planner's predictions against a real GPU in one short window (../shared/GPU_VALIDATION.md):
#   bash benchmarks/gpu_validate.sh          on the GPU machine, gpu-bundle/ carried (benchmarks/gpu_bundle.sh)
#   bash benchmarks/gpu_validate.sh --cpu    the same driver on the CPU (tiny model; CI runs it)
#   --only=1b-adamw-4bit,launch=suggested   some cases and launches (a short window's rerun)
# Results go to $OUT (default: validate-out/) as they come, at most 8 files; the summary table is
# the last thing printed. Its own last deadline is 470 s after it starts (--cpu: 240 s), so an
# outer limit of ~9 minutes holds it. Exit: 0 every case ran or was skipped with a reason, 1 a
# case or launch failed, 2 setup failed (no GPU, the wheels did not install).
set -uo pipefail
STARTED=$(date +%s.%N)
HERE=$(cd "$(dirname "$0")/.." && pwd)
cd "$HERE"
MODE=gpu
BUDGET=470
EXTRA=()
for arg in "$@"; do
  case "$arg" in
    --cpu) MODE=cpu; BUDGET=240 ;;
    --budget=*) BUDGET=${arg#--budget=} ;;
    --skip-launches) EXTRA+=(--skip-launches) ;;
    --only=*) EXTRA+=(--only "${arg#--only=}") ;;
    *) echo "usage: bash benchmarks/gpu_validate.sh [--cpu] [--budget=SECONDS] [--skip-launches] [--only=KEY,launch=NAME,...]" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-$HERE/validate-out}
mkdir -p "$OUT"
PY=${PY:-python3}
exec > >(tee -a "$OUT/log.txt") 2>&1
TEE=$!

if [ "$MODE" = gpu ]; then
  # setup fails fast: the carried wheels, offline, into a private folder ahead of the machine's own
  SITE=${PLANNER_SITE:-/tmp/planner-site}
  if ! ls gpu-bundle/*.whl >/dev/null 2>&1; then
    echo "setup: no gpu-bundle/*.whl here: build it with bash benchmarks/gpu_bundle.sh and carry gpu-bundle" >&2
    exit 2
  fi
  if ! timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
       --target "$SITE" gpu-bundle/*.whl; then
    echo "setup: the carried wheels did not install" >&2
    exit 2
  fi
  export PYTHONPATH="$SITE:$HERE${PYTHONPATH:+:$PYTHONPATH}"
  export DS_BUILD_OPS=0
  echo "setup: wheels installed in $(awk "BEGIN {print $(date +%s.%N) - $STARTED}") s"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore::FutureWarning
ARGS=(--out "$OUT" --started "$STARTED" --budget "$BUDGET" "${EXTRA[@]}")
[ "$MODE" = cpu ] && ARGS+=(--cpu)
# the driver's own deadline is BUDGET; this outer one only catches a hang past it
timeout --signal=TERM --kill-after=10 $((${BUDGET%.*} + 30)) "$PY" -u "$HERE/benchmarks/gpu_validate.py" "${ARGS[@]}"
rc=$?
echo "gpu_validate: exit $rc; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exec 1>&- 2>&-
wait "$TEE" 2>/dev/null   # log.txt complete before the command returns
exit $rc
