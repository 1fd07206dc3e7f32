"""The README.md of an exported package: how to install and call it, and every op's numbers."""

from __future__ import annotations

from typing import Any

from kernforge.verifier.verdict import BOUNDED

from .export import ExportPlan

BASELINE_NAMES = {"eager": "the PyTorch reference", "compile": "torch.compile of the reference"}


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _label(shape: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


def _signature(name: str, spec: dict[str, Any]) -> str:
    types = {"tensor": "Tensor", "int": "int", "float": "float", "bool": "bool"}
    args = ", ".join(f"{a['name']}: {types[a['kind']]}" + (f" = {a['default']!r}" if "default" in a else "")
                     for a in spec["args"])
    n = spec["n_outputs"]
    returns = "None" if n == 0 else f"tuple[{', '.join(['Tensor'] * n)}]" if spec["returns_tuple"] else "Tensor"
    mutated = f"  # writes {', '.join(spec['mutated'])} in place" if spec["mutated"] else ""
    return f"{name}({args}) -> {returns}{mutated}"


def _table(op: str, spec: dict[str, Any]) -> list[str]:
    rows = ["| arch | measured on | dtype | shape | runs | time (us) | x eager | x compile | x library | % roofline "
            "| max abs err |",
            "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    entries = spec["_entries"]
    for e in entries:
        for b in e["buckets"]:
            ev = b["evidence"]
            runs = (f"`{e['kernel']}` (attempt {e['attempt_id']})" if e["kernel"]
                    else f"reference (fastest kernel: attempt {ev['attempt_id']}, numbers shown)")
            hidden = " (hidden)" if ev.get("hidden") else ""
            at_most, at_least = ("<= ", ">= ") if ev.get("method") == BOUNDED else ("", "")
            rows.append(
                f"| {e['arch']} | {e['gpu']} | {e['dtype']} | {_label(b['shape'])}{hidden} "
                f"| {runs} | {at_most}{_num(ev.get('time_us'), '.2f')} "
                f"| {at_least}{_num(ev.get('speedup_eager'), '.2f')} | {at_least}{_num(ev.get('speedup_compile'), '.2f')} "
                f"| {_library_x(ev)} | {_num(ev.get('pct_roofline'), '.0f')} | {_num(ev.get('max_abs_err'), '.2g')} |"
            )
    return rows


def _library_x(ev: dict[str, Any]) -> str:
    """The speedup over the production library, and which one, where it was measured."""
    x = ev.get("speedup_library")
    return "-" if x is None else f"{x:.2f} ({ev.get('library') or 'library'})"


def readme(plan: ExportPlan, manifest: dict[str, Any]) -> str:
    name = plan.name
    ops = manifest["ops"]
    for op in ops.values():
        op["_entries"] = []
    for e in manifest["entries"]:
        ops[e["op"]]["_entries"].append(e)
    first = plan.ops[0]
    call_args = ", ".join(a.name for a in first.signature.args if not a.init)
    sel = manifest["selection"]
    tasks = sel["tasks"] if isinstance(sel["tasks"], str) else ", ".join(sel["tasks"])
    gpus = sel["gpus"] if isinstance(sel["gpus"], str) else ", ".join(sel["gpus"])
    lines = [
        f"# {name}",
        "",
        f"Verified kernels exported by kernforge from `{manifest['source']['archive']}`: "
        f"{len(ops)} op(s), {sum(len(o['kernels']) for o in ops.values())} kernel(s). "
        f"Selected: {tasks}; {gpus}. A bucket runs its kernel only where it measured at least "
        f"{sel['min_speedup']:g}x the speed of {BASELINE_NAMES[sel['baseline']]}. Only GPU-verified kernels are "
        "exported: the Triton interpreter (CPU) checks correctness only and its times are never ranked. Every "
        "kernel passed an audit: judged again in a fresh worker on fresh inputs, accepted again and about as fast.",
        "",
        "## Install and use",
        "",
        "```bash",
        "pip install .            # or: pip wheel --no-deps . && pip install <the wheel>",
        "```",
        "",
        "```python",
        f"import {name}",
        f"out = {name}.{first.op}({call_args})   # also torch.ops.{name}.{first.op}",
        f"{name}.counters()      # {{'hits': {{op: {{kernel: n}}}}, 'fallbacks': {{op: {{reason: n}}}}}}",
        f"{name}.reset_counters()",
        f'{name}.explain("{first.op}", ...)   # the kernel a call would run, or the fallback and why',
        "```",
        "",
        "Each op is a `torch.library.custom_op` with a fake implementation: it works under "
        "`torch.compile(fullgraph=True)` and inside CUDA graphs. Ops that write their inputs in place "
        "declare them in `mutates_args` and return nothing. Inference only: no autograd formula is registered.",
        "",
        "## Ops",
    ]
    for op_name, spec in ops.items():
        desc = spec["task"]["description"].split("\n\n")[0].replace("\n", " ")
        lines += ["", f"### {op_name}", "", desc, "", "```python", _signature(op_name, spec["signature"]), "```", ""]
        lines += _table(op_name, spec)
    for op in ops.values():
        del op["_entries"]
    lines += [
        "",
        "Times are the median device time per call on the GPU named, from CUDA-graph replay "
        "(flagged `eager` in manifest.json where the verifier fell back to eager timing); "
        "`x eager` and `x compile` are speedups over the PyTorch reference and over `torch.compile` of it, "
        "measured side by side; `x library` over a production kernel library (named, with its version) where one "
        "covers the op and was installed; `% roofline` is the share of the hardware floor for the shape. "
        "`<=` marks a time that is a bound, not a measurement (what its timed batch paid once outgrew a tenth of "
        "its window, at launch-bound sizes), and `>=` its speedups.",
        "",
        "## Dispatch",
        "",
        "A call picks, in order: the architecture of its tensors' device (`sm_90`; CPU tensors count as "
        "`interpreter` only while `TRITON_INTERPRET=1`), the dtype of its first floating-point tensor, "
        "a check that every tensor has the dtype and rank it was verified with, is contiguous and on one "
        "device, a check of the sizes that never varied in verification (fixed axes), and then the "
        "nearest bucket (a verified shape) by the sum of |log2(1+a) - log2(1+b)| over every dimension of "
        "every tensor argument and every scalar argument. The bucket names a kernel or keeps the "
        "PyTorch reference. A call that reaches no kernel runs the reference and is counted under "
        "the step that stopped it: `arch`, `dtype`, `inputs`, `size` or `bucket`. Counters count each "
        "time the op's body runs: every eager or compiled call, and once per CUDA-graph capture (a "
        "replay runs no Python).",
        "",
        "`manifest.json` holds, per entry, the op, architecture, GPU, dtype, shape range and buckets, "
        "the source attempt id and content hash, and the evidence: time, speedups, % of roofline, "
        "maximum errors and the environment, and the kernel's audit (passed, why, the time measured again).",
        "",
        "## Tests",
        "",
        "```bash",
        "pip install pytest && python -m pytest tests   # CUDA when there is a GPU, else TRITON_INTERPRET=1",
        "```",
        "",
        "Every entry against the reference on new inputs of every input distribution, a size between "
        "buckets, `torch.library.opcheck`, `torch.compile(fullgraph=True)`, CUDA-graph capture and "
        "replay (GPU), and each fallback. Entries verified for another architecture are skipped.",
    ]
    if plan.notes:
        lines += ["", "## Left out", ""] + [f"- {n}" for n in plan.notes]
    return "\n".join(lines) + "\n"
