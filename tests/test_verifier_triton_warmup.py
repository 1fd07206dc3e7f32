"""Triton kernels compiled without running them (verifier/triton_warmup.py): every launch a
compile, everything patched put back after, and an autotuner's pick never kept on disk."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")


def test_what_it_patches_is_put_back_even_when_a_call_inside_it_fails():
    """The compile-ahead process goes on calling the library for real after it: every launch
    must launch again, and an autotuner time its configs again."""
    from triton.runtime import autotuner
    from triton.runtime.jit import JITFunction

    from kernforge.verifier.triton_warmup import compile_only

    before = (JITFunction.run, {name: autotuner.Autotuner.__dict__[name] for name in ("do_bench", "check_disk_cache")})
    with pytest.raises(RuntimeError):
        with compile_only():
            assert JITFunction.run is not before[0]
            raise RuntimeError("a library that fails inside it")
    assert (JITFunction.run, {name: autotuner.Autotuner.__dict__[name] for name in before[1]}) == before


def test_an_autotuners_pick_is_never_kept_while_kernels_are_only_compiled():
    """Compiled ahead, an autotuner times every config alike, so its pick is the first config: kept
    in the Triton cache another process reads (a kernel's ``cache_results``), a library baseline
    there would time that config instead of the fastest, and a speedup over it would be inflated."""
    from triton.runtime import autotuner

    from kernforge.verifier.triton_warmup import compile_only

    before = {name: autotuner.Autotuner.__dict__[name] for name in ("do_bench", "check_disk_cache")}
    benched: list[bool] = []
    with compile_only():
        kept = autotuner.Autotuner.check_disk_cache(object(), ("key",), [], lambda: benched.append(True))
        bench = autotuner.Autotuner.do_bench.fget(object())
        assert bench(lambda: benched.append(True), quantiles=(0.5, 0.2)) == [0.0, 0.0]
    assert kept is False and benched == [True, True]
    assert {name: autotuner.Autotuner.__dict__[name] for name in before} == before, "all as it was after"


def test_a_triton_without_its_own_do_bench_gets_none_left_behind(monkeypatch):
    """compile_only always sets the autotuner's do_bench; where the class had none of its own, none
    is left after (a set one would turn every later benchmark into a single untimed call)."""
    from triton.runtime import autotuner

    from kernforge.verifier.triton_warmup import compile_only

    monkeypatch.delattr(autotuner.Autotuner, "do_bench")
    with compile_only():
        assert "do_bench" in autotuner.Autotuner.__dict__
    assert "do_bench" not in autotuner.Autotuner.__dict__
