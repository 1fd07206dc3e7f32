"""Where a batch's time goes (GPU only): the same seed at its largest public shape, timed inside
one process in the ways that separate the judge's batch from the old per-call graph time.

    python bench/overhead_probe.py --tasks rms_norm silu_and_mul softmax

Rows, per call (us):
  per-call graph   each call replayed alone from a graph, L2 flushed, a GPU sleep before it (old way)
  batch, one set   one graph of M calls on the same inputs, events around the replay
  batch, M sets    one graph of M calls, each on inputs of its own (caching allocator)
  + write          the same, the trusted SM write of the inputs first, (window - write) / M
  shared, M sets   inputs and outputs in CUDA VMM memory (the arena), events around the replay
  + write          the same with the write first: the judge's batch without a second process
  judge            the judge's time of record and the worker's own clock (both processes)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from graph_timer import per_call_graph_us  # noqa: E402

from kernforge.tasks import runtime  # noqa: E402
from kernforge.tasks.loader import load_task  # noqa: E402
from kernforge.verifier import heap, timing, vmm  # noqa: E402


def _graph(fn, sets, pool=None):
    for _ in range(2):
        fn(*sets[0])
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        for s in sets:
            fn(*s)
    torch.cuda.synchronize()
    return g


def _replay_us(g, calls, l2, reps=5, region=None, pristine=None):
    out = []
    for _ in range(reps):
        l2.flush()
        torch.cuda.synchronize()
        start, written, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        start.record()
        if region is not None:
            timing.write(region, pristine)
        written.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        out.append((start.elapsed_time(end) - start.elapsed_time(written)) * 1e3 / calls)
    return statistics.median(out)


def _placed(inputs_per_call, base: torch.Tensor):
    """Copies of every call's tensors laid out one after another in ``base`` (flat uint8)."""
    at, sets = 0, []
    for inputs in inputs_per_call:
        placed = []
        for x in inputs:
            if isinstance(x, torch.Tensor):
                n = x.numel() * x.element_size()
                view = base[at: at + n].view(x.dtype).view(x.shape)
                view.copy_(x)
                placed.append(view)
                at = -(-(at + n) // 512) * 512
            else:
                placed.append(x)
        sets.append(placed)
    return sets, at


def probe(name: str, window_ms: float) -> dict:
    task = load_task(name)
    shape = runtime.largest_shape(task, "cuda")
    seed = runtime.load_module(task.seed_path)
    model = runtime.build_model(seed.ModelNew, runtime.make_init_inputs(task, shape), 0, "cuda")
    dist = task.distributions[0]
    l2 = timing.L2Control(torch.device("cuda"))
    row = {"task": name}
    three = [runtime.make_inputs(task, shape, dist, k + 1, "cuda") for k in range(3)]
    row["per_call"] = old = per_call_graph_us(model, three)
    calls = max(2, min(512, math.ceil(window_ms * 1e3 / old)))
    row["M"] = calls
    g = _graph(model, [three[0]] * calls)
    row["one_set"] = _replay_us(g, calls, l2)
    del g
    sets = [runtime.make_inputs(task, shape, dist, k + 1, "cuda") for k in range(calls)]
    g = _graph(model, sets)
    row["m_sets"] = _replay_us(g, calls, l2)
    flat = [x for s in sets for x in s if isinstance(x, torch.Tensor)]
    nbytes = sum(x.numel() * x.element_size() + 512 for x in flat)
    region = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    placed, used = _placed(sets, region)
    pristine = region[:used].clone()
    del g
    g = _graph(model, placed)
    row["m_sets_write"] = _replay_us(g, calls, l2, region=region[:used], pristine=pristine)
    del g, placed, region
    torch.cuda.empty_cache()
    out_bytes = sum(o.numel() * o.element_size() for o in runtime.collect_outputs(model(*sets[0]), sets[0], task.mutated_inputs))
    block = vmm.create(used + 2 * max(out_bytes, 1) * calls + (2 << 30), 0)
    shared = block.tensor()
    placed, _ = _placed(sets, shared[:used])
    pool = heap.HeapPool(block.ptr + -(-used // heap.PAGE) * heap.PAGE, block.size - -(-used // heap.PAGE) * heap.PAGE)
    with pool.use():
        for _ in range(2):
            model(*placed[0])
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool.id):
        for s in placed:
            model(*s)
    torch.cuda.synchronize()
    row["shared"] = _replay_us(g, calls, l2)
    row["shared_write"] = _replay_us(g, calls, l2, region=shared[:used], pristine=pristine)
    del g, placed, sets, three, shared
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return row


def judge_row(name: str) -> dict:
    from kernforge.loop.evaluate import open_judge, resolve_device
    from kernforge.verifier.judge import JudgeOptions

    task = load_task(name)
    with open_judge(resolve_device(0), options=JudgeOptions(time_shapes="largest", baselines=False)) as judge:
        judge.verify(task.seed_source, task)
        v = judge.verify(task.seed_source, task)
    if not v.accepted:
        return {"judge": f"{v.status.value}: {v.reason[:200]}"}
    s = v.shapes[0]
    return {"judge": s.time_us, "judge_worker": s.claimed_us, "judge_M": s.batch_calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="*", default=["rms_norm", "silu_and_mul", "softmax"])
    parser.add_argument("--window-ms", type=float, default=5.0)
    parser.add_argument("--no-judge", action="store_true")
    args = parser.parse_args()
    cols = ["per_call", "one_set", "m_sets", "m_sets_write", "shared", "shared_write", "judge", "judge_worker"]
    print("task".ljust(14), "M".rjust(4), *(c.rjust(13) for c in cols))
    for name in args.tasks:
        try:
            row = probe(name, args.window_ms)
        except Exception as err:  # one task's failure must not hide the others
            print(name, "probe failed:", type(err).__name__, str(err)[:300])
            row = {"task": name}
        if not args.no_judge:
            try:
                row.update(judge_row(name))
            except Exception as err:
                row["judge"] = f"{type(err).__name__}: {str(err)[:200]}"
        cells = [f"{row[c]:13.2f}" if isinstance(row.get(c), float) else str(row.get(c, "-")).rjust(13) for c in cols]
        print(name.ljust(14), str(row.get("M", "-")).rjust(4), *cells, flush=True)


if __name__ == "__main__":
    main()
