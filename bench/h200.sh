#!/usr/bin/env bash
# One lease on the H200: set up (wheels the image lacks, kernforge on the path), then run the
# phases named on the command line, each with its own log under $OUT. Phases:
#   env      GPU, driver and versions
#   tests    the gpu-marked tests (seeds on every built-in task, verifier GPU threats)
#   verify   bench/verify.py (seeds vs eager and torch.compile, spread, time to verdict)
#   probe    bench/timing_probe.py (spread within and between processes)
#   ncu      bench/ncu_check.py (device time against ncu's gpu__time_duration)
#   sandbox  bench/sandbox.py on the GPU
#   loop     bench/loop.py and an offline run on three tasks
#   export   the export flow with GPU-verified entries
#   transfer bench/transfer_probe.py (moving outputs between the workers; one comparison)
# Usage (from the repository root on the device machine): bash bench/h200.sh env tests verify
set -u
OUT=${OUT:-/tmp/kf-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
mkdir -p /tmp/kfpath && ln -sfn "$PWD" /tmp/kfpath/kernforge
export PYTHONPATH=/tmp/kfpath:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
# Workers started with their own PYTHONPATH (tests, bench/sandbox.py) find kernforge through a .pth.
SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
printf '/tmp/kfpath\n/tmp/site\n' > "$SITE/kernforge-device.pth" 2>/dev/null || echo "note: $SITE is read-only; workers rely on PYTHONPATH"

export PYTHONUNBUFFERED=1 KERNFORGE_CACHE_DIR=/tmp/kf-cache
kf() { python3 -c "from kernforge.cli import main; main()" "$@"; }

phase() {  # phase NAME TIMEOUT COMMAND...
  local name=$1 limit=$2; shift 2
  echo "=== $name ($(date +%T))"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "=== $name exit $? ($(date +%T))"
  tail -n 40 "$OUT/$name.log"
}

for p in "$@"; do
  case $p in
    env) phase env 60 bash -c 'nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"; kf() { python3 -c "from kernforge.cli import main; main()" "$@"; }; kf doctor' ;;
    tests) phase tests 900 python3 -m pytest -m gpu -x -q -p no:cacheprovider tests/ ;;
    tests-nox) phase tests 500 python3 -m pytest -m gpu -q -p no:cacheprovider --durations=10 tests/ ;;
    final) phase final 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_verifier_gpu.py -k "side_stream or triton or stale or rms_norm" ;;
    verify1) phase verify1 150 python3 bench/verify.py --repeats 5 --tasks rms_norm silu_and_mul --json "$OUT/verify1.json" ;;
    sandbox-quick) phase sandbox 120 python3 bench/sandbox.py --device gpu --candidates 8 ;;
    smoke) phase smoke 560 python3 -m pytest -m gpu -q -p no:cacheprovider --durations=15 tests/test_tasks_builtin.py tests/test_verifier_gpu.py ;;
    verify) phase verify 900 python3 bench/verify.py --repeats 3 --json "$OUT/verify.json" ;;
    verify3) phase verify3 240 python3 bench/verify.py --repeats 5 --tasks rms_norm silu_and_mul softmax --json "$OUT/verify3.json" ;;
    probe) phase probe 300 python3 bench/timing_probe.py --task rms_norm --processes 3 --runs 3 ;;
    ncu) phase ncu 90 python3 bench/ncu_check.py --task rms_norm ;;
    sandbox) phase sandbox 300 python3 bench/sandbox.py --device gpu --candidates 20 --pool-size 4 --paced 10 ;;
    loop) phase loop 600 python3 bench/loop.py --gpu 0 ;;
    loop-short) phase loop 270 python3 bench/loop.py --gpu 0 --attempts 10 --hours 0.06 --db "$OUT/loop.db" --json "$OUT/loop.json" ;;
    transfer) phase transfer 120 python3 bench/transfer_probe.py --mb 470 --reps 5 --dirs /tmp /dev/shm --contend ;;
    fixes) phase fixes 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_verifier_gpu.py tests/test_tasks_builtin.py -k "stale or degenerate" ;;
    *) echo "unknown phase $p" ;;
  esac
done
