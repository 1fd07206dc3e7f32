"""Bringing sandbox and verifier together: a judge per device, its workers from a backend.

The only place that knows both: the verifier names the entry points its workers run, the
sandbox runs them. ``kernforge eval`` and ``kernforge run`` both come through here.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from kernforge.sandbox.bytecode import compile_missing_in_background
from kernforge.sandbox.isolation import for_profiler, mechanism as choose_mechanism
from kernforge.sandbox.pool import ProcessBackend
from kernforge.sandbox.protocol import Backend, HomeSeed, WorkerSpec
from kernforge.tasks.loader import secret_paths
from kernforge.tasks.spec import Task
from kernforge.verifier.cache import compiled_dir, default_dir
from kernforge.verifier.gate import DeviceGate
from kernforge.verifier.judge import (
    HARNESS_PRELOAD, HARNESS_WARMUP, REFERENCE_PRELOAD, REFERENCE_WARMUP, Judge, JudgeOptions,
)
from kernforge.verifier.triton_seed import TritonSeed
from kernforge.verifier.verdict import Verdict


#: how long the audit waits for a worker under Nsight Compute to start before it goes without
PROFILED_START_S = 120.0


class EvaluationError(Exception):
    """The evaluation stack could not be set up (bad device, no docker engine...)."""


def visible_gpus() -> list[int]:
    import torch

    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


def resolve_devices(gpus: Sequence[int]) -> list[str]:
    """'cuda:N' for the GPUs asked for (all visible ones if none), else ['cpu']."""
    visible = visible_gpus()
    for g in gpus:
        if g not in visible:
            raise EvaluationError(f"--gpu {g}: no such GPU here "
                                  f"(visible: {visible or 'none; leave out --gpu to use the CPU interpreter'})")
    chosen = list(dict.fromkeys(gpus)) or visible
    return [f"cuda:{g}" for g in chosen] or ["cpu"]


def resolve_device(gpu: int | None) -> str:
    """'cuda:N' for an explicit GPU, the first GPU when there is one, else 'cpu'."""
    return resolve_devices(() if gpu is None else (gpu,))[0]


def make_backend(kind: str, spec: WorkerSpec, pool_size: int, *, refill: bool = True,
                 starts: Callable[[Any], Callable[[], None]] | None = None, seed: HomeSeed | None = None) -> Backend:
    """``starts``: the GPU gate's ``warming``, told of each worker as it starts; ``seed``: what a
    worker's home starts with (triton_seed.py). Both process sandbox only: a container's processes
    are not the parent's to stop, and its home is the container's own."""
    if kind == "process":
        return ProcessBackend(spec, pool_size=pool_size, refill=refill, starts=starts, seed=seed)
    if kind == "docker":
        from kernforge.sandbox.docker_backend import DockerBackend

        return DockerBackend(spec, pool_size=pool_size, refill=refill)
    raise EvaluationError(f"--sandbox must be 'process' or 'docker', not {kind!r}")


def evaluate_file(path: Path, task_name: str, *, gpu: int | None = None, sandbox: str = "process") -> tuple[Verdict, str]:
    """``kernforge eval``: one candidate file, one task, a fresh judge."""
    from kernforge.tasks.loader import load_task

    try:
        source = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise EvaluationError(f"{path}: cannot read the candidate ({err})") from None
    task = load_task(task_name)
    device = resolve_device(gpu)
    with open_judge(device, sandbox=sandbox, pool_size=1, tasks=[task]) as judge:
        return judge.verify(source, task), task.name


@contextlib.contextmanager
def open_judge(device: str, *, sandbox: str = "process", pool_size: int = 1,
               options: JudgeOptions | None = None, tasks: Sequence[Task] = (),
               time_box: Mapping[str, float] | None = None, gate: DeviceGate | None = None) -> Iterator[Judge]:
    """A judge for one device with a warm candidate pool and a trusted reference worker. The
    candidates' workers never see the built-in tasks' files nor the metadata of ``tasks`` (the
    hidden shapes of the tasks it will judge); their reference reaches them as text. ``time_box``:
    a wall limit in seconds per task name for each candidate's worker (fairness.py); ``gate``: the
    device's gate, shared by every judge of one GPU (verifier/gate.py)."""
    slot = "cpu" if device == "cpu" else device.split(":", 1)[1]
    # the judge's cache (baselines, ceilings, trusted code's compiles) is never a candidate's to
    # see: outside the home folder (KERNFORGE_CACHE_DIR) a worker of the same uid could rewrite a
    # baseline, or a compiled kernel the reference worker would run
    chosen = options or JudgeOptions()
    cache = chosen.cache_dir or default_dir()
    compiled = compiled_dir(cache)
    private = tuple(chosen.private_paths)
    hidden = secret_paths(tasks) + (str(cache),) + private
    # a candidate's worker writes no bytecode: compile what the install lacks, once, for all of them
    # (never what a candidate may not see)
    compile_missing_in_background(exclude=hidden)
    # On the CPU a candidate forks nothing (the interpreter builds nothing; a CUDA extension built
    # there could not run): a forked child there computed each call's outputs with torch, beyond
    # every trace. On a GPU nvcc forks while an extension builds, and a forked child has no CUDA.
    candidate_spec = WorkerSpec(device=slot, preload=HARNESS_PRELOAD, warmup=HARNESS_WARMUP, isolation="strict",
                                hidden_paths=hidden, fork=device != "cpu")
    reference_spec = WorkerSpec(device=slot, preload=REFERENCE_PRELOAD, warmup=REFERENCE_WARMUP, isolation="none",
                                trusted_cache=str(compiled))
    # a worker warming up is stopped while a judge times (gate.warming): now and then its CUDA
    # context's creation or first kernel landed in a timed window (bench/start_noise_probe.py)
    gate = gate or DeviceGate()
    starts = gate.warming if device != "cpu" else None
    # a worker's warm-up builds Triton's modules in its own cache: the first warm one's are copied
    # into every later worker's (on the CPU the interpreter builds none)
    seed = TritonSeed() if device != "cpu" else None
    candidates = make_backend(sandbox, candidate_spec, pool_size, starts=starts, seed=seed)
    try:
        # The reference worker is trusted and long-lived: one process, no twin warming behind it.
        references = ProcessBackend(reference_spec, pool_size=1, refill=False)
    except Exception:
        candidates.close()
        raise
    def profiled(prefix: tuple[str, ...]) -> Backend:  # the audit's Nsight Compute worker (process sandbox only)
        # Never stopped while it warms up: its tree is Nsight Compute's (its front end, a launcher,
        # the worker), and a worker under ncu whose tree was stopped and let go around a judge's
        # windows never became ready (H100, session 63: 0 of 1 in 39 s, its job blocked on a
        # futex; unstopped, 11.0 s), and an audit's record waited for it until the run ended. Its
        # warm-up runs beside the audit's second verdict as before session 62; that verdict's time
        # is judged again where it does not hold (audit.py).
        return ProcessBackend(replace(candidate_spec, profiler=prefix), pool_size=1, refill=False,
                              start_timeout=PROFILED_START_S, mechanism=for_profiler(choose_mechanism("strict")),
                              seed=seed)

    judge = Judge(candidates, references, replace(options or JudgeOptions(), device=device),
                  profiled=profiled if sandbox == "process" else None, gate=gate)
    judge.time_box.update(time_box or {})
    try:
        yield judge
    finally:
        judge.close()
        candidates.close()
        references.close()
