#!/usr/bin/env bash
# One lease on the H200: set up (bench/h200_env.sh: wheels the image lacks, kernforge on the
# path), then run the phases named on the command line, each with its own log under $OUT. Phases:
#   env        GPU, driver and versions, `kernforge doctor`
#   tests      the gpu-marked tests (seeds on every built-in task, verifier GPU threats), stop at the first failure
#   tests-nox  the same, all of them, with the ten slowest listed (log: tests.log)
#   final      a quick subset of tests/test_verifier_gpu.py (side streams, Triton, stale outputs, rms_norm)
#   verify     bench/verify.py on every built-in task (seeds vs eager and torch.compile, spread, time to verdict)
#   verify1    bench/verify.py on two tasks (rms_norm, silu_and_mul)
#   routine    bench/verify.py --shapes public on three tasks (a routine verdict's steps: every public shape timed; ROUTINE_TASKS: others)
#   verify3    bench/verify.py on three tasks (rms_norm, silu_and_mul, softmax)
#   routinep   routine with every reference worker profiled (cProfile records under $OUT/prof, packed as prof.tgz; the
#              profiler slows every Python call: where the time goes, not how much); ROUTINE_TASKS: other tasks (say
#              fp8_quant_per_token alone, for a short call on where verify_batch's check and gather go)
#   routinewin routine once per long-batch length in ROUTINE_WINDOWS (ms, default "5 2.5"), ROUTINE_REPEATS repeats (3):
#              a verdict's seconds against each public shape's time of record and its spread (logs, routine-w<ms>.json)
#   routinecalls  routine once per batch sizing in ROUTINE_CALLS ("MOST:US", default "512:4 4096:1": at most MOST calls in a
#              long batch, a call assumed to take US at least), ROUTINE_REPEATS repeats (3), one cache: the launch-bound shapes'
#              times of record, their pairs' spread and what a batch pays once, against a verdict's seconds (routine-c*.json)
#   routineserial  routine with the checked calls overlapped with the reference's compares (the judge's way), then one
#              process at a time (--serial-checks); ROUTINE_REPEATS (3), ROUTINE_TASKS (rms_norm silu_and_mul): routine-<mode>.json
#   routinecomp  routine with the timed windows verified by the compiled stacked reference (KERNFORGE_COMPILED_REFERENCE=1,
#              verifier/reference_compiled.py), ROUTINE_REPEATS repeats (3) (log, routinecomp.json)
#   gpulib     the library baselines' GPU test: each installed library's output agrees with the reference at every
#              public shape in the GPU dtype (library.agreement, checked before a library is timed)
#   gpucomp    the compiled stacked reference's GPU test: every built-in task, every call of a batch against eager
#   compsteps  bench/refworker_steps.py at silu_and_mul's and rms_norm's largest shapes (a 2.5 ms window's calls), eager and
#              with the compiled stacked reference (logs compsteps0, compsteps1)
#   compref    bench/compiled_reference.py: a window's stacked reference eagerly against torch.compile (ms, compile s, agreement)
#   routinebefore  routine with the code of the carried .before/ (`git archive COMMIT | tar -x -C .before`): a change's
#              effect on routine verdicts, side by side on one lease (log, routinebefore.json)
#   routineab  routine now, then with the carried .before/'s code, ROUTINE_REPEATS repeats (3), both on one cache (the
#              baselines compiled once, where the two codes key them alike): (logs, routineab-now.json, routineab-before.json)
#   routinet   routine with every reference worker under torch.profiler (KERNFORGE_REFWORKER_PROFILER=torch): per verdict,
#              each request's and each op's host time beside its kernels' device time, as a table and JSON under $OUT/prof
#              (prof.tgz), summed per request in refprofile.log (bench/refworker_profile.py): whether a window's verification is bound by
#              the GPU or by launching its kernels (ROUTINE_TASKS)
#   seeds      bench/verify.py on every built-in task, one repeat (first verdict and a warm one each)
#   baselines  bench/baselines.py: each task's judge baselines (eager, compile, library) and seed at its largest public shape beside a
#              standalone static torch.compile in a fresh process (BASELINE_TASKS: a subset; BASELINE_SETS: the standalone's least
#              number of input sets, say the judge's calls per batch; log, baselines.json)
#   rcache     bench/verify.py on reshape_and_cache and silu_and_mul, one repeat (the baselines' regions per dtype)
#   compare    bench/compare_probe.py (timed batches' pass/fail: PyTorch's ops against the fused kernel)
#   ncu        bench/ncu_check.py (the trusted time of record against the old per-call graph time and ncu)
#   sandbox    bench/sandbox.py on the GPU
#   ipc        bench/ipc_probe.py (shared device memory, trusted batch clock, time-slicing, ncu)
#   ipc1       the same, one configuration (64 MB calls)
#   quiet      bench/quiet_probe.py (can a probe before a timed window tell that another process has GPU work queued?)
#   gputest    the verifier's GPU tests alone (tests/test_verifier_gpu.py), every failure listed
#   probe      bench/overhead_probe.py (where a batch's time goes, one process, against the judge)
#   kahead     bench/kernels_ahead.py: each seed's Triton kernels compiled ahead at the public shapes, its first calls
#              there with and without those files (KAHEAD_TASKS: a subset)
#   census     bench/census_probe.py (what a checked call costs the worker besides its kernels: the op
#              trace and the profiler's census, per call, at the smallest public shape)
#   gputestx   the verifier's GPU tests (and the reference graph's and the stacked reference's) on three pytest-xdist workers sharing the GPU
#   busyhost   an honest seed judged while twice as many processes as cores burn the CPU (the clock rule's busy host), alone
#   drawn      every seed against its reference at its public, hidden and 12 drawn GPU shapes (tasks/draws.py)
#   steps      bench/refworker_steps.py on the GPU (a window's input draw, call by call and batched, and comparison: ms and aten ops)
#   ncusbx     bench/ncu_sandbox.py (Nsight Compute inside the sandbox's isolation, one step at a time, and the audit's profiled worker)
#   bytecode   bench/bytecode_probe.py (a candidate worker's preload from source against the bytecode
#              sandbox/bytecode.py compiles beside the sources; the image's torch has none)
#   footprint  bench/footprint_probe.py (per-call time against where the buffers live and how much memory a batch touches)
#   sweep      bench/clock_sweep.py (the batch window against its number of calls: fixed cost or per-call excess)
#   tinysweep  the same on TINY_TASKS (rms_norm silu_and_mul fp8_quant_per_group), up to 4096 calls a batch: at the
#              launch-bound shapes, the fixed cost a batch pays against its window, and each batch size's time of record
#              ("bounded" or the difference) against the seed's per-call graph time in one process
#   kb         bench/kernelbench.py on six KernelBench problems (those issue #14 names) at their default sizes
#   kbbig      the same, the three whose calls move 6-8 GB (ReLU, softmax, RMSNorm), alone in one call
#   kball      bench/kernelbench.py on every problem with a candidate (32; one whole call, partial log if cut)
#   kboff      `kernforge bench kernelbench --offline` on five level-1 problems, 3 attempts each (log, kboff.db)
#   contender  the judge's bar on the GPU (tests/test_verifier_gpu.py -k slower_than_the_bar) and the fp8 seeds
#   kbrun      bench/kbrun.sh: `kernforge bench kernelbench --offline` on 32 level-1 and 11 level-2 problems, 2 attempts
#              each, one lane; resumes the run in .kbrun/kbrun.db when that is carried (log, kbrun.db; KBRUN_S s, 540)
#   ahead      the GPU tests of the torch.compile baseline compiled before the GPU is taken alone, and of baselines beside an honest kernel
#   kgpu       the GPU tests of a seed given its kernels compiled ahead (its verdict and its audit) and of an audit's record
#   hostsync   the verifier's GPU tests of an eagerly timed honest kernel, stale device memory and an early done
#   gputestk   the verifier's GPU tests that rest on the timed windows (GPU_K: a pytest -k; default the red team's attacks,
#              a padded short batch, an honest kernel's timings, a routine verdict's shapes, the bar) on three xdist workers
#   gpufocus   a few of the verifier's GPU tests (-k), for a short call
#   loop       bench/loop.py and an offline run on three tasks
#   loop-short bench/loop.py cut to 10 attempts and about 4 minutes (log: loop.log)
#   loop14     bench/loop.py on all 14 built-in tasks from an empty archive, LOOP_S seconds (default 290), LANES lanes (1; issue #17:
#              every task's first verdict within 5 minutes; log, loop14.db, loop14.json). LOOP_HOURS (default 8, a night's): the
#              run's own time budget, which keeps the audits of the first bests waiting for every task's first verdict, as a night
#              run does; the phase stops it at LOOP_S + 30 s (SIGTERM: the run abandons the verdict in flight and writes its JSON).
#              A budget of LOOP_S (LOOP_HOURS=0.08 for 290 s) starts them early to fit before its end: on an H100 that
#              left 5 of 14 tasks without a first verdict, the audits taking the run's last 155 s
#   loop14before  loop14 with the code of the carried .before/ (`git archive COMMIT | tar -x -C .before`; workers import it
#              through PYTHONPATH too; a cache of its own): before and after on one lease (log, loop14before.db/.json)
#   loop14b    the same tasks again on that archive (baselines kept, tried configurations not proposed again): the
#              carried .loop14/loop14.db, else this call's loop14.db (log, loop14b.db, loop14b.json; named
#              loop14b$LOOP_TAG, so that one call can run it twice, e.g. with LANES=4 and LANES=1, each on a copy;
#              every thread's stack each minute in loop14b$LOOP_TAG.stacks.log, for a run that makes no verdict).
#              LOOP_HOURS as for loop14 (every loop14 phase, before or after, has the same): with a night's the
#              audits loop14 left (it is stopped, not ended) take at most their share of the GPU (loop/audit_queue.py
#              AUDIT_SHARE) and the verdicts go on; with a budget of LOOP_S they are due at once and hold them back
#   loop14bbefore  loop14b with the code of the carried .before/ on a copy of the carried .loop14/loop14.db, else of this
#              call's loop14.db (the caches loop14 warmed copied for it; a cache of its
#              own; the copy's schema version lowered to the before code's, whose later migrations only add columns and
#              tables): the second run before and after on one lease (log, loop14bbefore.db/.json)
#   lanes      bench/loop.py, 3 tasks (LANES_TASKS) x 12 attempts, LANES_S s (180) each run of LANES_RUNS (default "2 1": two
#              lanes, then one). Caches the first run warms favour the later ones (logs lanes<run>.log, .db, .json)
#   timeslice  bench/timeslice_probe.py: a step of small kernels and a sync, alone and beside another process's GPU work
#   mpson, mpsoff  an MPS control daemon for the phases between (the trusted processes share one GPU context; a candidate's
#              worker never joins, sandbox/env.py; logs <phase>-mps), e.g. `timeslice mpson timeslice lanes mpsoff`: whether
#              MPS takes the slices between processes away (H100, session 59: beside small steps a little, beside
#              another lane's large streams it made a small step's wait 22x its time alone, against 8x without)
#   windows    bench/verify.py --shapes public with two timed windows of each kind per shape (a routine verdict's), then three:
#              a verdict's time against its time of record's spread over 4 repeats (WINDOW_TASKS; logs windows2/3)
#   night      issue #15's built-in-suite night, cut to NIGHT_S seconds (240; the run's own --hours, so it ends itself and
#              prints bench/loop.py's table with "vs seed") on NIGHT_TASKS (six tasks with the tuner's room), from an empty
#              archive (log, night.db, night.json)
#   nightbefore  the same with the code of the carried .before/ (the tuner before issue #15: `git archive e8406f5`)
#   startnoise  bench/start_noise_probe.py: a timed window's time per call alone, beside workers warming up, and beside
#              them stopped for each window (as the gate stops what is enlisted with it)
#   wstart     bench/worker_start.py: candidate workers' starts, six at once, without and with the pool's Triton cache seed,
#              beside WSTART_LOAD (4) processes spinning on the CPU; where each start's seconds go (log, wstart.json)
#   pstart     bench/profiled_start_probe.py: a seeded worker, a seeded one under Nsight Compute, and one under ncu
#              stopped around a judge's windows: which become ready, and where their starts went
# SMI=1 (any phases): the GPU's utilization sampled throughout, and the host's cores (bench/cpu_sample.py), per phase in
#   gpubusy.log (bench/gpu_busy.py)
# Usage (from the repository root on the device machine): bash bench/h200.sh env tests verify
set -u
. "$(dirname "${BASH_SOURCE[0]}")/h200_env.sh"
# Workers started with their own PYTHONPATH (tests, bench/sandbox.py) find kernforge through a .pth.
SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
printf '/tmp/kfpath\n/tmp/site\n' > "$SITE/kernforge-device.pth" 2>/dev/null || echo "note: $SITE is read-only; workers rely on PYTHONPATH"

# The "before" phases: the carried .before/ importable as kernforge through /tmp/kfbefore (workers too,
# through PYTHONPATH), or a line saying what to carry and a non-zero status.
before_code() {
  if [ ! -f .before/bench/loop.py ]; then echo "$1: carry .before (git archive COMMIT | tar -x -C .before)"; return 1; fi
  mkdir -p /tmp/kfbefore && ln -sfn "$PWD/.before" /tmp/kfbefore/kernforge
}

# SMI=1: nvidia-smi's utilization every 100 ms through every phase, summed per phase at the end (bench/gpu_busy.py)
if [ "${SMI:-0}" = 1 ]; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory --format=csv,noheader -lms 100 > "$OUT/smi.log" 2>&1 &
  smi_pid=$!
  python3 bench/cpu_sample.py "$OUT/cpu.log" &  # the host's cores too: is the pipeline short of CPU?
  cpu_pid=$!
  trap 'kill $smi_pid $cpu_pid 2>/dev/null; python3 bench/gpu_busy.py "$OUT/smi.log" "$OUT/phases.log" --cpu "$OUT/cpu.log" > "$OUT/gpubusy.log" 2>&1' EXIT
fi

for p in "$@"; do
  case $p in
    env) phase env 60 bash -c 'nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"; kf doctor' ;;
    tests) phase tests 900 python3 -m pytest -m gpu -x -q -p no:cacheprovider tests/ ;;
    tests-nox) phase tests 500 python3 -m pytest -m gpu -q -p no:cacheprovider --durations=10 tests/ ;;
    final) phase final 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_verifier_gpu.py -k "side_stream or triton or stale or rms_norm" ;;
    verify) phase verify 900 python3 bench/verify.py --repeats 3 --json "$OUT/verify.json" ;;
    verify1) phase verify1 120 python3 bench/verify.py --repeats 3 --tasks rms_norm silu_and_mul --json "$OUT/verify1.json" ;;
    routine) phase routine 240 python3 bench/verify.py --shapes public --repeats 2 --tasks ${ROUTINE_TASKS:-fp8_quant_per_group rms_norm silu_and_mul} \
               --json "$OUT/routine.json" ;;
    routinewin) for w in ${ROUTINE_WINDOWS:-5 2.5}; do  # the long batch's length: a verdict's seconds against its times' spread
                phase "routine-w$w" 240 python3 bench/verify.py --shapes public --repeats "${ROUTINE_REPEATS:-3}" --window-ms "$w" \
                  --tasks ${ROUTINE_TASKS:-fp8_quant_per_group rms_norm silu_and_mul} --json "$OUT/routine-w$w.json"; done ;;
    routinecalls) mkdir -p /tmp/kf-calls-cache; for c in ${ROUTINE_CALLS:-512:4 4096:1}; do  # most calls a batch : least us a call
                phase "routine-c${c/:/-}" 240 python3 bench/verify.py --shapes public --repeats "${ROUTINE_REPEATS:-3}" \
                  --max-calls "${c%%:*}" --min-call-us "${c##*:}" --cache-dir /tmp/kf-calls-cache \
                  --tasks ${ROUTINE_TASKS:-fp8_quant_per_group rms_norm silu_and_mul moe_topk_softmax} \
                  --json "$OUT/routine-c${c/:/-}.json"; done ;;
    routineserial) for mode in overlap serial; do  # the checked calls overlapped with the compares, then one process at a time
                phase "routine-$mode" 240 python3 bench/verify.py --shapes public --repeats "${ROUTINE_REPEATS:-3}" \
                  $([ "$mode" = serial ] && echo --serial-checks) --tasks ${ROUTINE_TASKS:-rms_norm silu_and_mul} \
                  --json "$OUT/routine-$mode.json"; done ;;
    routinecomp) KERNFORGE_COMPILED_REFERENCE=1 phase routinecomp 240 python3 bench/verify.py --shapes public --repeats "${ROUTINE_REPEATS:-3}" \
                   --tasks ${ROUTINE_TASKS:-fp8_quant_per_group rms_norm silu_and_mul} --json "$OUT/routinecomp.json" ;;
    gpulib) phase gpulib 200 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf --timeout 150 tests/test_verifier_library.py ;;
    gpucomp) phase gpucomp 200 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf --timeout 120 tests/test_verifier_reference_compiled.py ;;
    compsteps) for c in 0 1; do  # a large window's draw and verification, eager and with the compiled stacked reference
                 KERNFORGE_COMPILED_REFERENCE=$c phase "compsteps$c" 150 bash -c 'python3 bench/refworker_steps.py --device cuda:0 \
                   --task silu_and_mul --shape T=16384,I=8192 --calls 10 --windows 4 && python3 bench/refworker_steps.py \
                   --device cuda:0 --task rms_norm --shape T=16384,H=8192 --calls 14 --windows 4'; done ;;
    compref) phase compref 150 python3 bench/compiled_reference.py --device cuda:0 ;;
    routinebefore) before_code "$p" || continue  # the same verdicts with the carried .before/'s code, on this lease
              PYTHONPATH=/tmp/kfbefore:$PYTHONPATH KERNFORGE_CACHE_DIR=/tmp/kf-cache-before phase routinebefore 240 \
                python3 .before/bench/verify.py --shapes public --repeats 2 --tasks ${ROUTINE_TASKS:-fp8_quant_per_group rms_norm silu_and_mul} \
                --json "$OUT/routinebefore.json" ;;
    routineab) before_code "$p" || continue
              for side in now before; do
                code=bench/verify.py; [ "$side" = before ] && code=.before/bench/verify.py
                PYTHONPATH=$([ "$side" = before ] && echo /tmp/kfbefore:)$PYTHONPATH phase "routineab-$side" 300 python3 "$code" \
                  --shapes public --repeats "${ROUTINE_REPEATS:-3}" --tasks ${ROUTINE_TASKS:-fp8_quant_per_group rms_norm silu_and_mul} \
                  --json "$OUT/routineab-$side.json"; done ;;
    routinep) mkdir -p "$OUT/prof"; KERNFORGE_REFWORKER_PROFILE="$OUT/prof" phase routine 240 python3 bench/verify.py --shapes public --repeats 2 \
                --tasks ${ROUTINE_TASKS:-fp8_quant_per_group rms_norm silu_and_mul} --json "$OUT/routine.json"; tar czf "$OUT/prof.tgz" -C "$OUT" prof && rm -rf "$OUT/prof" ;;
    routinet) mkdir -p "$OUT/prof"; KERNFORGE_REFWORKER_PROFILE="$OUT/prof" KERNFORGE_REFWORKER_PROFILER=torch phase routine 240 \
                python3 bench/verify.py --shapes public --repeats 2 --tasks ${ROUTINE_TASKS:-silu_and_mul rms_norm} --json "$OUT/routine.json"
              python3 bench/refworker_profile.py "$OUT/prof" --ops 25 > "$OUT/refprofile.log" 2>&1
              tar czf "$OUT/prof.tgz" -C "$OUT" prof && rm -rf "$OUT/prof" ;;
    seeds) phase seeds 320 python3 bench/verify.py --repeats 1 --json "$OUT/seeds.json" ;;
    baselines) phase baselines 330 python3 bench/baselines.py ${BASELINE_TASKS:+--tasks $BASELINE_TASKS} ${BASELINE_SETS:+--min-sets $BASELINE_SETS} \
                 --json "$OUT/baselines.json" ;;
    rcache) phase rcache 100 python3 bench/verify.py --repeats 1 --tasks reshape_and_cache silu_and_mul --json "$OUT/rcache.json" ;;
    verify3) phase verify3 200 python3 bench/verify.py --repeats 3 --tasks rms_norm silu_and_mul softmax --json "$OUT/verify3.json" ;;
    compare) phase compare 120 python3 bench/compare_probe.py --calls 8 ;;
    ncu) phase ncu 120 python3 bench/ncu_check.py --tasks rms_norm silu_and_mul softmax ;;
    sandbox) phase sandbox 300 python3 bench/sandbox.py --device gpu --candidates 20 --pool-size 4 --paced 10 ;;
    ipc) phase ipc 300 bash -c 'python3 bench/ipc_probe.py --mb 64 --calls 8 32 128 --batches 5 && python3 bench/ipc_probe.py --mb 1 --calls 64 512 2048 --batches 5' ;;
    quiet) phase quiet 90 python3 bench/quiet_probe.py ;;
    startnoise) phase startnoise 120 python3 bench/start_noise_probe.py --seconds "${STARTNOISE_S:-25}" --starters 3 ;;
    wstart) phase wstart 150 python3 bench/worker_start.py --workers 6 --rounds "${WSTART_ROUNDS:-2}" --load "${WSTART_LOAD:-4}" \
              --json "$OUT/wstart.json" ;;
    pstart) phase pstart 150 python3 bench/profiled_start_probe.py --wait 40 ;;
    ipc1) phase ipc 70 python3 bench/ipc_probe.py --mb 64 --calls 8 --batches 3 ;;
    gputest) phase gputest 330 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=line --timeout 90 --durations=8 tests/test_verifier_gpu.py ;;
    probe) phase probe 200 python3 bench/overhead_probe.py --tasks rms_norm silu_and_mul softmax ;;
    census) phase census 150 python3 bench/census_probe.py --device cuda:0 --task rms_norm --task silu_and_mul --task softmax \
             --task rotary_embedding --task moe_topk_softmax --task merge_attn_states ;;
    gputestx) phase gputest 260 python3 -m pytest -m gpu -v -p no:cacheprovider --tb=line -rf --timeout 120 -n 3 --durations=12 tests/test_verifier_gpu.py tests/test_verifier_reference_graph.py tests/test_verifier_reference_batched.py tests/test_verifier_late_reads.py ;;
    busyhost) phase busyhost 200 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf --timeout 180 tests/test_verifier_gpu_busy_host.py ;;
    drawn) phase drawn 240 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf --timeout 200 -n 3 tests/test_tasks_builtin.py -k seed_matches ;;
    steps) phase steps 200 python3 bench/refworker_steps.py --device cuda:0 --task rms_norm --task silu_and_mul --task softmax --task fused_add_rms_norm \
             --task rotary_embedding --task moe_topk_softmax --task merge_attn_states ;;
    ncusbx) phase ncusbx 200 python3 bench/ncu_sandbox.py --timeout 25 ;;
    bytecode) phase bytecode 240 python3 bench/bytecode_probe.py --repeats 3 ;;
    footprint) phase footprint 60 python3 bench/footprint_probe.py ;;
    sweep) phase sweep 240 python3 bench/clock_sweep.py --json "$OUT/sweep.json" ;;
    tinysweep) phase tinysweep 300 python3 bench/clock_sweep.py --tasks ${TINY_TASKS:-rms_norm silu_and_mul fp8_quant_per_group} \
                 --windows 1 2.5 5 10 20 --json "$OUT/tinysweep.json" ;;
    kb) phase kb 240 python3 bench/kernelbench.py --problems 19_ReLU 88_MinGPTNewGelu 23_Softmax 47_Sum_reduction_over_a_dimension 36_RMSNorm_ 40_LayerNorm --json "$OUT/kb.json" ;;
    kbbig) phase kb 230 python3 bench/kernelbench.py --problems 19_ReLU 23_Softmax 36_RMSNorm_ --json "$OUT/kb.json" ;;
    kbfix) phase kb 200 python3 bench/kernelbench.py --problems 56_Matmul_Sigmoid_Sum 47_Sum_reduction_over_a_dimension 9_Matmul_Subtract_Multiply_ReLU 63_Gemm_ReLU_Divide 99_Matmul_GELU_Softmax --json "$OUT/kb.json" ;;
    kboff) phase kboff 150 bash -c 'P=bench/kernelbench/problems/level1; kf bench kernelbench --offline --max-attempts 3 --db "$OUT/kboff.db" $P/19_ReLU.py $P/23_Softmax.py $P/36_RMSNorm_.py $P/47_Sum_reduction_over_a_dimension.py $P/88_MinGPTNewGelu.py' ;;
    contender) phase contender 100 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short --timeout 90 tests/test_verifier_gpu.py -k "slower_than_the_bar or fp8_quant" ;;
    kbrun) phase kbrun "$((${KBRUN_S:-540} + 40))" bash bench/kbrun.sh "$OUT/kbrun.db" "${KBRUN_S:-540}" ;;
    kball) phase kb 580 python3 bench/kernelbench.py --json "$OUT/kb.json" ;;
    kahead) phase kahead 300 python3 bench/kernels_ahead.py ${KAHEAD_TASKS:+--tasks $KAHEAD_TASKS} ;;
    ahead) phase ahead 150 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short --timeout 120 tests/test_verifier_gpu.py -k "compiled_before_the_gpu or honest_kernel_accepted_with_timings" ;;
    kgpu) phase kgpu 200 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf --timeout 150 tests/test_verifier_gpu.py -k "kernels_compiled_ahead or audit_of_a_seed" ;;
    hostsync) phase hostsync 110 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short --timeout 60 tests/test_verifier_gpu.py -k "presends_done or host_sync or stale_device" ;;
    gputestk) phase gputestk 200 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=line -rf --timeout 100 -n 3 tests/test_verifier_gpu.py \
                -k "${GPU_K:-redteam or padded or honest_kernel_accepted or routine_verdict or slower_than_the_bar}" ;;
    gpufocus) phase gpufocus 190 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short --timeout 100 tests/test_verifier_gpu.py -k "presends_done or host_sync or stale_device or nsight or decoy" ;;
    loop) phase loop 600 python3 bench/loop.py --gpu 0 ;;
    lanes) for run in ${LANES_RUNS:-2 1}; do
                phase lanes$run "$((${LANES_S:-180} + 20))" python3 bench/loop.py --gpu 0 \
                --attempts 12 --hours "$(python3 -c "print(${LANES_S:-180} / 3600)")" --lanes $run ${LANES_TASKS:+--tasks $LANES_TASKS} \
                --db "$OUT/lanes$run${PHASE_SUFFIX:-}.db" --json "$OUT/lanes$run${PHASE_SUFFIX:-}.json"; done ;;
    timeslice) phase timeslice 150 python3 bench/timeslice_probe.py ;;
    mpson) # an MPS control daemon for the phases after it (the trusted processes share one GPU context; the pipe
           # outside /tmp, which a sandboxed worker gets its own of): their logs are named <phase>-mps
           export CUDA_MPS_PIPE_DIRECTORY=/var/tmp/kf-mps-pipe CUDA_MPS_LOG_DIRECTORY=/var/tmp/kf-mps-log
           mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY && chmod 700 $CUDA_MPS_PIPE_DIRECTORY  # root only: no candidate
           if nvidia-cuda-mps-control -d; then PHASE_SUFFIX=-mps; echo "=== MPS on"
           else echo "mpson: nvidia-cuda-mps-control -d failed: the phases after it run without MPS"; unset CUDA_MPS_PIPE_DIRECTORY; fi ;;
    mpsoff) if [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then echo quit | nvidia-cuda-mps-control; sleep 2
              cp "$CUDA_MPS_LOG_DIRECTORY/control.log" "$OUT/mps-control.log" 2>/dev/null
              cp "$CUDA_MPS_LOG_DIRECTORY/server.log" "$OUT/mps-server.log" 2>/dev/null; fi
            unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY PHASE_SUFFIX; echo "=== MPS off" ;;
    loop-short) phase loop 270 python3 bench/loop.py --gpu 0 --attempts 10 --hours 0.06 --db "$OUT/loop.db" --json "$OUT/loop.json" ;;
    loop14before) before_code "$p" || continue
              PYTHONPATH=/tmp/kfbefore:$PYTHONPATH KERNFORGE_CACHE_DIR=/tmp/kf-cache-before phase loop14before "$((${LOOP_S:-290} + 30))" \
                python3 .before/bench/loop.py --gpu 0 --tasks $(ls tasks/builtin | grep -v __) --attempts 1000 \
                --hours "${LOOP_HOURS:-8}" --db "$OUT/loop14before.db" --json "$OUT/loop14before.json" ;;
    loop14) KERNFORGE_CACHE_DIR=/tmp/kf-cache-loop14 phase loop14 "$((${LOOP_S:-290} + 30))" python3 bench/loop.py --gpu 0 --tasks $(ls tasks/builtin | grep -v __) \
              --attempts 1000 --hours "${LOOP_HOURS:-8}" --lanes "${LANES:-1}" --db "$OUT/loop14.db" --json "$OUT/loop14.json" ;;
    loop14b) b=loop14b${LOOP_TAG:-}
             if [ -f .loop14/loop14.db ]; then cp .loop14/loop14.db "$OUT/$b.db"; else cp "$OUT/loop14.db" "$OUT/$b.db"; fi
             KERNFORGE_CACHE_DIR=/tmp/kf-cache-loop14 phase "$b" "$((${LOOP_S:-290} + 30))" python3 bench/loop.py --gpu 0 --tasks $(ls tasks/builtin | grep -v __) \
              --attempts 1000 --hours "${LOOP_HOURS:-8}" --lanes "${LANES:-1}" --db "$OUT/$b.db" --json "$OUT/$b.json" --stacks "$OUT/$b.stacks.log" ;;
    loop14bbefore) before_code "$p" || continue
             if [ -f .loop14/loop14.db ]; then cp .loop14/loop14.db "$OUT/loop14bbefore.db"
             elif [ -f "$OUT/loop14.db" ]; then cp "$OUT/loop14.db" "$OUT/loop14bbefore.db"
             else echo "loop14bbefore: carry .loop14/loop14.db, or run loop14 first in this call"; continue; fi
             # the caches loop14 warmed, as loop14b has them (compiled ahead: the judge's comparison kernels, baselines)
             [ -d /tmp/kf-cache-loop14 ] && [ ! -d /tmp/kf-cache-before ] && cp -a /tmp/kf-cache-loop14 /tmp/kf-cache-before
             # the archive's schema version lowered to the newest the before code knows: every later migration only adds
             # nullable columns and tables (archive/schema.py), which the before code neither reads nor needs
             PYTHONPATH=/tmp/kfbefore:$PYTHONPATH python3 -c 'import sqlite3, sys
from kernforge.archive.schema import LATEST
db = sqlite3.connect(sys.argv[1]); v = db.execute("PRAGMA user_version").fetchone()[0]
db.execute(f"PRAGMA user_version = {min(v, LATEST)}"); db.commit(); print(f"loop14bbefore: schema v{v} read as v{min(v, LATEST)}")' "$OUT/loop14bbefore.db"
             PYTHONPATH=/tmp/kfbefore:$PYTHONPATH KERNFORGE_CACHE_DIR=/tmp/kf-cache-before phase loop14bbefore "$((${LOOP_S:-290} + 30))" \
                python3 .before/bench/loop.py --gpu 0 --tasks $(ls tasks/builtin | grep -v __) --attempts 1000 \
                --hours "${LOOP_HOURS:-8}" --db "$OUT/loop14bbefore.db" --json "$OUT/loop14bbefore.json" ;;
    windows) for b in 2 3; do phase "windows$b" 240 python3 bench/verify.py --shapes public --repeats 4 --batches "$b" \
               --tasks ${WINDOW_TASKS:-rms_norm silu_and_mul softmax} --json "$OUT/windows$b.json"; done ;;
    night|nightbefore) # issue #15: a night of NIGHT_S seconds (its own --hours) on NIGHT_TASKS, with this code or .before's
             if [ "$p" = nightbefore ]; then
               before_code "$p" || continue
               code=.before pypath=/tmp/kfbefore:$PYTHONPATH
             else code=. pypath=$PYTHONPATH; fi
             hours=$(python3 -c "print(${NIGHT_S:-240} / 3600)")
             PYTHONPATH=$pypath KERNFORGE_CACHE_DIR=/tmp/kf-cache-$p phase "$p" "$((${NIGHT_S:-240} + 45))" \
               python3 $code/bench/loop.py --gpu 0 --tasks ${NIGHT_TASKS:-rms_norm silu_and_mul softmax fused_add_rms_norm gemm_small_m rotary_embedding} \
               --attempts 1000 --hours "$hours" --db "$OUT/$p.db" --json "$OUT/$p.json" ;;
    *) echo "unknown phase $p" ;;
  esac
done
