"""A kernel module checked in-process against its task's reference: every shape given, every
input distribution, every output (the seeds' and the honest corpus's own tests; the verifier's
tests judge them sandboxed as well)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from kernforge.tasks import runtime
from kernforge.tasks.spec import Shape, Task
from kernforge.verifier.compare import compare
from kernforge.verifier.reference import clone_inputs, collect_outputs, run_reference, strict_precision


def check_kernel(task: Task, device: str, shapes: Iterable[Shape], path: Path) -> None:
    """Assert that ``ModelNew`` of the module at ``path`` matches the reference at ``shapes``."""
    strict_precision()
    reference = runtime.reference_module(task)
    kernel = runtime.load_module(path)
    failures = []
    for shape in shapes:
        init = runtime.make_init_inputs(task, shape)
        ref_model = runtime.build_model(reference.Model, init, 0, device)
        cand_model = runtime.build_model(kernel.ModelNew, init, 0, device)
        for dist in task.distributions:
            inputs = runtime.make_inputs(task, shape, dist, 99, device)
            high, low = run_reference(ref_model, inputs, task.mutated_inputs)
            cand_inputs = clone_inputs(inputs)
            outs = collect_outputs(cand_model(*cand_inputs), cand_inputs, task.mutated_inputs)
            assert len(outs) == len(high), f"{shape} {dist}: {len(outs)} outputs, reference has {len(high)}"
            for i, (c, h, lo) in enumerate(zip(outs, high, low)):
                assert c.shape == h.shape, f"{shape} {dist} output {i}: shape {tuple(c.shape)} != {tuple(h.shape)}"
                assert c.dtype == lo.dtype, f"{shape} {dist} output {i}: dtype {c.dtype} != {lo.dtype}"
                result = compare(c, h, task.tolerance(str(lo.dtype).removeprefix("torch.")), low=lo)
                if not result.ok:
                    failures.append(f"{shape} {dist} output {i}: {result.describe()}")
    assert not failures, "\n".join(failures)
