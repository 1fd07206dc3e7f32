"""Triton kernels compiled without running them: every launch turned into Triton's own warm-up
(compile the kernel and build its launcher, launch nothing).

Two places compile ahead this way, on meta tensors, so that no GPU work is done: a candidate's
kernels in a sandboxed worker before its verdict (triton_ahead_worker.py), and a task's library
baseline before a trusted compile-ahead process takes the GPU's gate to call it (library.py
``compile_ahead``): called for the first time with the gate held, Liger-Kernel's kernels compiled
there, and a second run's first audit waited 14-19 s at the gate behind one such hold (H100,
session 57).

An autotuner's benchmark calls each config once, so that each is compiled, and times them all
alike: its pick is no pick. So the pick is never kept on disk (Triton keeps it in its cache where
a kernel asks for ``cache_results``): another process reading it would time the first config
instead of the fastest (a library baseline made slower, a speedup over it inflated).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


@contextlib.contextmanager
def compile_only(built: set[str] | None = None) -> Iterator[None]:
    """Within it, in this process, every Triton launch compiles its kernel and builds the kernel's
    launcher (once per kernel in ``built``, which a caller may keep from one use to the next),
    and runs nothing; an autotuner compiles every config and keeps no pick on disk."""
    from triton.runtime import autotuner
    from triton.runtime.jit import JITFunction

    launch = JITFunction.run
    bench = autotuner.Autotuner.__dict__.get("do_bench")
    disk = autotuner.Autotuner.__dict__.get("check_disk_cache")
    built = set() if built is None else built

    def warm_up(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["warmup"] = True
        kernel = launch(self, *args, **kwargs)
        build_launcher(kernel, built)
        return kernel

    def once(kernel_call: Any, quantiles: Any = None, **_: Any) -> list[float]:
        kernel_call()
        return [0.0] * len(quantiles or (0.5,))

    def nothing_kept(self: Any, tuning_key: Any, configs: Any, bench_fn: Any) -> bool:
        bench_fn()
        return False

    JITFunction.run = warm_up
    autotuner.Autotuner.do_bench = property(lambda self: once)
    if disk is not None:
        autotuner.Autotuner.check_disk_cache = nothing_kept
    try:
        yield
    finally:
        JITFunction.run = launch
        if bench is None:  # a Triton whose Autotuner has no do_bench of its own: none left behind
            del autotuner.Autotuner.do_bench
        else:
            autotuner.Autotuner.do_bench = bench
        if disk is not None:
            autotuner.Autotuner.check_disk_cache = disk


def build_launcher(kernel: Any, built: set[str]) -> None:
    """``kernel``'s launcher built into the cache as its first launch would build it (Triton 3.6
    compiles a C module per kernel signature with the host's compiler: a verdict paid for it at
    each new kernel's first call); once per kernel, and nothing where it fails or where Triton's
    launcher is generic (it then builds nothing)."""
    key = getattr(kernel, "hash", None)
    if key is None or key in built:
        return
    built.add(key)
    try:
        from triton.runtime import driver

        driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001 - its first launch builds it, as before
        pass
