"""The judge's old way of timing, kept as a yardstick for the benches: each call replayed alone
from a CUDA graph, the L2 flushed and a short GPU sleep queued before it, CUDA events around
the replay, inside one (trusted) process. The judge's time of record now comes from its
reference worker's clock over a batch (verifier/refworker.py); benches show the two agree.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Sequence

import torch

from kernforge.verifier import timing


def per_call_graph_us(fn: Callable[..., Any], input_sets: Sequence[list[Any]], reps: int = 200) -> float:
    """Median microseconds of one call, replayed alone from a graph per input set."""
    l2 = timing.L2Control(torch.device("cuda"))
    for s in input_sets:
        for _ in range(2):
            fn(*s)
    torch.cuda.synchronize()
    graphs = []
    for s in input_sets:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn(*s)
        graphs.append(g)
    torch.cuda.synchronize()
    l2.spin(0.1)
    times = []
    for r in range(reps):
        g = graphs[r % len(graphs)]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        l2.flush()
        l2.gate()
        start.record()
        g.replay()
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(1e3 * s.elapsed_time(e) for s, e in times)
