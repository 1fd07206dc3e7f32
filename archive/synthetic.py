"""Synthetic attempts with realistic shape: for bench/archive.py and the archive's tests.

Deterministic for a given ``random.Random``. Code differs per attempt in the tokens a real tuner
changes (block sizes, warps) plus a salt constant, so content hashes differ unless asked not to.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any, Mapping

from kernforge.verifier.audit import Audit, compare
from kernforge.verifier.verdict import THREATS, Accepted, Rejected, ShapeResult, Status, Verdict

from .records import NewAttempt, TaskRecord

TASKS = ("rms_norm", "softmax", "rotary_embedding", "fp8_quant_per_token", "gemm_small_m", "silu_and_mul")
#: (proposer, model)
PROPOSERS = (("llm", "minimax-m3"), ("llm", "qwen3-coder"), ("llm", "deepseek-v3"), ("tuner", ""))
H200 = {"gpu": "NVIDIA H200", "driver": "570.86", "cuda": "12.8", "torch": "2.13.0", "triton": "3.5.0",
        "arch": "sm_90", "device": "cuda"}
A100 = {"gpu": "NVIDIA A100-SXM4-80GB", "driver": "570.86", "cuda": "12.8", "torch": "2.13.0", "triton": "3.5.0",
        "arch": "sm_80", "device": "cuda"}
INTERPRETER = {"gpu": None, "driver": None, "cuda": None, "torch": "2.13.0", "triton": "3.5.0",
               "arch": "interpreter", "device": "cpu"}
ENVIRONMENTS = (H200, A100, INTERPRETER)
#: how often each verdict comes back, roughly what an LLM loop sees
STATUS_WEIGHTS = {
    Status.ACCEPTED: 40, Status.INCORRECT: 18, Status.COMPILE_ERROR: 12, Status.RUNTIME_ERROR: 10,
    Status.CHEAT: 6, Status.STATIC_REJECTED: 6, Status.TIMEOUT: 5, Status.CRASHED: 3,
}

_KERNEL = '''import torch
import triton
import triton.language as tl

SALT = {salt}


@triton.jit
def _{task}_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    acc = tl.sum(x * x, axis=0) / n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    y = x * tl.rsqrt(acc + eps) * w
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def {task}(x, w, eps=1e-6):
    out = torch.empty_like(x)
    _{task}_kernel[(x.shape[0],)](x, w, out, x.shape[1], eps, BLOCK={block}, num_warps={warps}, num_stages={stages})
    return out


class ModelNew(torch.nn.Module):
    def forward(self, x, w):
        return {task}(x, w)
'''


def task_record(name: str) -> TaskRecord:
    return TaskRecord(name=name, source_hash=f"synthetic-{name}", spec={"name": name, "synthetic": True})


def code(rng: random.Random, task: str, salt: int) -> str:
    return _KERNEL.format(salt=salt, task=task, block=rng.choice((256, 512, 1024, 2048, 4096)),
                          warps=rng.choice((1, 2, 4, 8, 16)), stages=rng.choice((1, 2, 3, 4)))


def shapes(rng: random.Random, status: Status, environment: Mapping[str, Any]) -> tuple[ShapeResult, ...]:
    timing = "interpreter" if environment.get("device") == "cpu" else rng.choice(("graph",) * 9 + ("eager",))
    out = []
    grid = [(t, h) for t in (1, 16, 128, 1024, 4096, 8192) for h in (2048, 4096, 5120, 8192)]
    for i, (t, h) in enumerate(rng.sample(grid, rng.randint(2, 8))):
        shape = {"T": t, "H": h}
        base = shape["T"] * shape["H"] * 6e-6 + 2.0  # a memory-bound op: bytes over ~4 TB/s, plus launch
        if status is Status.ACCEPTED:
            t = base * rng.uniform(0.6, 2.5)
            eager, compiled = base * rng.uniform(2.0, 4.0), base * rng.uniform(1.1, 1.8)
            out.append(ShapeResult(
                shape=shape, hidden=i % 3 == 2, dtype="bfloat16", timing=timing, time_us=t,
                spread_pct=rng.uniform(0.2, 3.0), eager_us=eager, compile_us=compiled, speedup_eager=eager / t,
                speedup_compile=compiled / t, gbps=shape["T"] * shape["H"] * 6 / t / 1e3, floor_us=base * 0.55,
                max_abs_err=rng.uniform(0, 4e-3), max_rel_err=rng.uniform(0, 8e-3),
            ))
        else:
            err = rng.uniform(0.1, 10.0) if status is Status.INCORRECT else None
            out.append(ShapeResult(shape=shape, hidden=i % 3 == 2, dtype="bfloat16", timing=timing,
                                   max_abs_err=err, max_rel_err=err))
    return tuple(out)


def verdict(rng: random.Random, environment: Mapping[str, Any]) -> Verdict:
    status = rng.choices(list(STATUS_WEIGHTS), weights=list(STATUS_WEIGHTS.values()))[0]
    measured = shapes(rng, status, environment)
    if status is Status.ACCEPTED:
        flags = ("eager timing fallback",) if any(s.timing == "eager" for s in measured) else ()
        return Accepted(shapes=measured, flags=flags, environment=dict(environment))
    threat = rng.choice(sorted(THREATS)) if status is Status.CHEAT else None
    reason = {
        Status.CHEAT: f"caught by the {THREATS.get(threat or 0, '')} check",
        Status.INCORRECT: "mismatch on hidden shape: max abs err above tolerance at index (3, 17)",
        Status.COMPILE_ERROR: "triton compile error: BLOCK must be a power of two",
        Status.RUNTIME_ERROR: "illegal memory access in kernel launch",
        Status.STATIC_REJECTED: "forward calls torch.nn.functional instead of its own kernel",
        Status.TIMEOUT: "no result within the 120 s wall-clock limit",
        Status.CRASHED: "worker exited with SIGSEGV",
    }[status]
    return Rejected(status=status, reason=reason, threat=threat, evidence={"check": status.value},
                    shapes=measured, environment=dict(environment))


def attempt(rng: random.Random, run_id: int, seq: int, task_id: int, task: str, salt: int, *,
            environment: Mapping[str, Any] = H200, parent_id: int | None = None) -> NewAttempt:
    proposer, model = rng.choice(PROPOSERS)
    source = code(rng, task, salt)
    tokens_in = rng.randint(2_000, 12_000) if proposer == "llm" else 0
    tokens_out = rng.randint(400, 3_000) if proposer == "llm" else 0
    return NewAttempt(
        run_id=run_id, seq=seq, task_id=task_id, code=source, verdict=verdict(rng, environment),
        environment=dict(environment), parent_id=parent_id, proposer=proposer, model=model,
        prompt=f"Write a faster Triton kernel for {task}. The parent kernel measured {rng.uniform(5, 90):.1f} us "
               f"at T=4096 H=4096 ({rng.uniform(10, 90):.0f}% of the bandwidth roofline). Keep fp32 accumulation.",
        response=f"Here is a version with a different block size:\n```python\n{source}```",
        tokens_in=tokens_in, tokens_out=tokens_out, cost_usd=(tokens_in * 0.3 + tokens_out * 1.2) / 1e6,
        latency_s=rng.uniform(2.0, 40.0),
    )


def audit(recorded: Verdict, ratio: float = 1.02, again: Verdict | None = None) -> Audit:
    """The audit of an accepted GPU verdict whose second verdict is ``again``, else the same verdict
    with every time ``ratio`` times the recorded one (``verifier.audit.compare`` decides)."""
    if again is None:
        again = replace(recorded, shapes=tuple(replace(s, time_us=s.time_us * ratio if s.time_us else s.time_us)
                                               for s in recorded.shapes))
    return compare(recorded, again)
