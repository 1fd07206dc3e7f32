# Sourced by bench/h200.sh and bench/h200_docker.sh (run from the repository root on the device
# machine): wheels the image lacks (.whl/, installed into /tmp/site), kernforge importable as a
# package through /tmp/kfpath, logs under $OUT, and the helpers both scripts use:
#   kf ARGS...                     the kernforge CLI (exported, so `bash -c 'kf ...'` finds it)
#   phase NAME TIMEOUT COMMAND...  run COMMAND under `timeout`, log to $OUT/NAME.log, print its exit
#                                  status and the log's last 40 lines
OUT=${OUT:-/tmp/kf-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
mkdir -p /tmp/kfpath && ln -sfn "$PWD" /tmp/kfpath/kernforge
export PYTHONPATH=/tmp/kfpath:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 KERNFORGE_CACHE_DIR=/tmp/kf-cache

kf() { python3 -c "from kernforge.cli import main; main()" "$@"; }
export -f kf

phase() {
  local name=$1${PHASE_SUFFIX:-} limit=$2 rc; shift 2  # PHASE_SUFFIX: h200.sh mpson
  echo "=== $name ($(date +%T))"
  echo "start $name $(date +%T)" >> "$OUT/phases.log"  # bench/gpu_busy.py's spans
  timeout -k 30 "$limit" "$@" >"$OUT/$name.log" 2>&1  # killed 30 s after TERM: a hung close must not eat the call
  rc=$?
  echo "end $name $(date +%T)" >> "$OUT/phases.log"
  echo "=== $name exit $rc ($(date +%T))"
  tail -n 40 "$OUT/$name.log"
}
