"""The timed batches' pass/fail comparison: PyTorch's element-wise ops against the fused kernel.

    python bench/compare_probe.py                    # GPU 0: rms_norm's, silu_and_mul's and softmax's outputs
    python bench/compare_probe.py --calls 40 --repeats 5

Per case: ``calls`` outputs of one shape stacked, as ``refworker._verify_batch`` compares them
(a bf16 output against a float32 reference and eager's bf16 one), timed with CUDA events, best of
``repeats``; the fused kernel's result must equal the PyTorch ops' (it is asserted per case). The
GB/s column counts the bytes the fused kernel must read (the output, both references).
"""

from __future__ import annotations

import argparse

import torch
from rich.console import Console
from rich.table import Table

from kernforge.tasks.spec import Tolerance
from kernforge.verifier import compare, compare_kernel

CASES = {"rms_norm T=16384 H=8192": (16384, 8192), "silu_and_mul T=16384 I=8192": (16384, 8192),
         "softmax B=4096 V=32000": (4096, 32000), "decode T=8 H=4096": (8, 4096)}
#: the dtypes of the built-in tasks' outputs, their float32/float64 references and eager's
SELF_CHECKS = [(torch.bfloat16, torch.float32, torch.bfloat16), (torch.float16, torch.float32, torch.float16),
               (torch.float32, torch.float32, torch.float32), (torch.float32, torch.float64, torch.float32),
               (torch.float8_e4m3fn, torch.float8_e4m3fn, torch.float8_e4m3fn),
               (torch.float8_e5m2, torch.float8_e5m2, torch.float8_e5m2), (torch.bfloat16, torch.float64, torch.bfloat16)]


def best_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=8, help="outputs compared at once (a chunk of a batch)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gpu", type=int, default=0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/compare_probe.py needs a GPU: the fused kernel runs only there")
    device = torch.device("cuda", args.gpu)
    torch.cuda.set_device(device)
    tol = Tolerance(rtol=1.6e-2, atol=1e-2)
    table = Table(title=f"Pass/fail of {args.calls} stacked outputs (bf16 against float32), best of {args.repeats}")
    for col in ("case", "PyTorch ops ms", "fused ms", "speedup", "fused GB/s"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for name, (rows, cols) in CASES.items():
        high = torch.randn(args.calls, rows, cols, device=device)
        low = high.bfloat16()
        cand = (high + 1e-3 * torch.randn_like(high)).bfloat16()
        cand[-1, -1, -1] = 100.0  # the last call fails: both must find it

        def ops():
            return compare.within_tolerance(cand, high, tol, low, fused=False)

        def fused():  # what the reference worker runs: the kernel, once it passed its self-check
            return compare.within_tolerance(cand, high, tol, low)

        assert ops().tolist() == fused().tolist() == [True] * (args.calls - 1) + [False]
        slow, fast = best_ms(ops, args.repeats), best_ms(fused, args.repeats)
        moved = cand.numel() * (2 + 4 + 2)
        table.add_row(name, f"{slow:.2f}", f"{fast:.2f}", f"{slow / fast:.1f}x", f"{moved / fast / 1e6:.0f}")
        del high, low, cand
        torch.cuda.empty_cache()
    console = Console()
    console.print(table)
    checks = Table(title="The fused kernel's self-check per dtype triple (output, reference, eager reference)")
    for col in ("output", "reference", "eager reference", "used"):
        checks.add_column(col)
    for c_dtype, h_dtype, lo_dtype in SELF_CHECKS:
        used = compare_kernel._self_checked(c_dtype, h_dtype, lo_dtype, device)
        checks.add_row(str(c_dtype), str(h_dtype), str(lo_dtype), "yes" if used else "NO")
    console.print(checks)
    for key, why in compare_kernel.NOT_USED.items():  # the kernel fell back to the PyTorch ops there
        console.print(f"fused kernel not used for {key}: {why}")


if __name__ == "__main__":
    main()
