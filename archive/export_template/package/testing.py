"""Checking this package's ops against the tasks' PyTorch references; used by its tests.

Needs nothing beyond torch. Inputs are drawn the way the verifier drew them: the task's own
``make_inputs`` (copied into ``tasks/<op>/inputs.py``) for each input distribution, or the
reference's ``get_inputs()`` under a seed. An output passes, element by element, when

    |c - h| <= rtol*|h| + atol*rms(h) + 2*|l - h|

with ``h`` the reference on inputs one step wider (bf16 -> fp32, fp32 -> fp64), ``l`` the
reference in the inputs' own dtype (its rounding error is allowed twice over) and ``rms(h)``
the output's root-mean-square, which scales ``atol`` to the output; (atol, rtol) are the
task's for the output's dtype, zero for integers; NaN and Inf must match exactly. These are
the verifier's rules, so an entry that passed there passes here on new draws.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Sequence

import torch

from ._dispatch import manifest

_UPCAST = {torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.float32: torch.float64}
_FRESH: dict[str, ModuleType] = {}


def _task_dir(op: str) -> Path:
    return Path(__file__).with_name("tasks") / op


def reference_module(op: str) -> ModuleType:
    """A private copy of the op's reference module: drawing inputs sets its size globals, which
    must not touch the module the op itself runs."""
    if op not in _FRESH:
        spec = importlib.util.spec_from_file_location(f"_{op}_reference_for_tests", _task_dir(op) / "reference.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _FRESH[op] = module
    return _FRESH[op]


def inputs_module(op: str) -> ModuleType | None:
    if not manifest()["ops"][op]["has_inputs_module"]:
        return None
    return importlib.import_module(f"{__package__}.tasks.{op}.inputs")


def _set_shape(module: ModuleType, shape: Mapping[str, int]) -> None:
    """Set the size globals, then run again the top-level lines computed from them (a
    KernelBench ``bias_shape = (out_features,)`` follows ``out_features``), as the verifier did."""
    for key, value in shape.items():
        setattr(module, key, value)
    for line in _recomputed(module):
        exec(line, module.__dict__)


def _recomputed(module: ModuleType) -> list[Any]:
    if "__recomputed__" not in module.__dict__:
        sizes = {k for k, v in vars(module).items() if type(v) is int}
        reads, lines = set(sizes), []
        for stmt in ast.parse(Path(module.__file__).read_text()).body:
            value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
            targets = (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]) if value is not None else []
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            if names and len(names) == len(targets) and not names & sizes \
                    and {n.id for n in ast.walk(value) if isinstance(n, ast.Name)} & reads:
                lines.append(compile(ast.Module(body=[stmt], type_ignores=[]), module.__file__, "exec"))
                reads |= names
        module.__dict__["__recomputed__"] = lines
    return module.__dict__["__recomputed__"]


def make_inputs(op: str, shape: Mapping[str, int], dist: str, seed: int, device: str, dtype: str) -> list[Any]:
    """The inputs of one call, determined by (op, shape, distribution, seed, device, dtype)."""
    meta = inputs_module(op)
    if meta is not None and hasattr(meta, "make_inputs") and dist != "default":
        generator = torch.Generator(device=device).manual_seed(seed)
        return list(meta.make_inputs(dict(shape), dist, getattr(torch, dtype), device, generator))
    module = reference_module(op)
    _set_shape(module, shape)
    devices = [torch.device(device).index or 0] if str(device).startswith("cuda") else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        inputs = module.get_inputs()
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]


def init_args(op: str, shape: Mapping[str, int]) -> list[Any]:
    module = reference_module(op)
    _set_shape(module, shape)
    return list(module.get_init_inputs())


def clone(values: Sequence[Any]) -> list[Any]:
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def outputs_of(op: str, result: Any, inputs: Sequence[Any]) -> list[torch.Tensor]:
    """What a call produced: its returned tensors, then the inputs it writes in place."""
    sig = manifest()["ops"][op]["signature"]
    outs = [] if result is None else list(result) if isinstance(result, (tuple, list)) else [result]
    names = [a["name"] for a in sig["args"]]
    return outs + [inputs[names.index(n)] for n in sig["mutated"]]


@torch.no_grad()
def run_reference(op: str, inputs: Sequence[Any], init: Sequence[Any]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(high, low): the reference one step wider and in the inputs' own dtype; inputs untouched."""
    model = reference_module(op).Model(*init)
    lo_inputs = clone(inputs)
    low = outputs_of(op, model(*lo_inputs), lo_inputs)
    hi_inputs = [x.to(_UPCAST[x.dtype]) if isinstance(x, torch.Tensor) and x.dtype in _UPCAST else x
                 for x in clone(inputs)]
    try:
        high = outputs_of(op, model(*hi_inputs), hi_inputs)
    except (RuntimeError, TypeError):  # an op with no wider kernel: the eager answer is all there is
        return low, low
    if [h.shape for h in high] != [l.shape for l in low]:
        return low, low
    return high, low


def tolerance(op: str, dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for an output of this dtype: the task's, by the output's dtype (fp8 outputs
    of a bf16 op get fp8's), integers exactly, anything else as float32."""
    table = manifest()["ops"][op]["tolerances"]
    tol = table.get(str(dtype).removeprefix("torch."), table["default"])
    return tol["atol"], tol["rtol"]


def compare(candidate: torch.Tensor, high: torch.Tensor, low: torch.Tensor, atol: float, rtol: float) -> str | None:
    """None when every element is within tolerance, else where and by how much it is not."""
    if candidate.dtype != low.dtype:
        return f"dtype {candidate.dtype} != reference dtype {low.dtype}"
    if candidate.shape != high.shape:
        return f"shape {tuple(candidate.shape)} != reference shape {tuple(high.shape)}"
    if candidate.numel() == 0:
        return None
    c = candidate.detach().to(torch.float64)
    h = high.detach().to(device=c.device, dtype=torch.float64)
    lo = low.detach().to(device=c.device, dtype=torch.float64)
    c_fin, h_fin = torch.isfinite(c), torch.isfinite(h)
    same = (~c_fin & ~h_fin) & ((torch.isnan(c) & torch.isnan(h)) | (c == h))
    nonfinite_bad = (~c_fin | ~h_fin) & ~same
    hf = torch.where(h_fin, h, torch.zeros_like(h))
    scale = float(hf.pow(2).mean().sqrt()) if bool(h_fin.any()) else 0.0
    ref_err = torch.where(torch.isfinite(lo) & h_fin, (lo - hf).abs(), torch.zeros_like(hf))
    allowed = (rtol * hf.abs() + atol * scale + 2 * ref_err).clamp_min(torch.finfo(torch.float32).tiny)
    both = c_fin & h_fin
    err = torch.where(both, (c - hf).abs(), torch.zeros_like(hf))
    bad = (both & (err > allowed)) | nonfinite_bad
    n_bad = int(bad.sum())
    if not n_bad:
        return None
    ratio = torch.where(bad, torch.where(nonfinite_bad, torch.full_like(err, float("inf")), err / allowed),
                        torch.zeros_like(err))
    flat = int(torch.argmax(ratio.reshape(-1)))
    index = list(torch.unravel_index(torch.tensor(flat), tuple(high.shape)))
    return (f"{n_bad} of {c.numel()} elements out of tolerance (atol {atol:g}, rtol {rtol:g}); worst at index "
            f"{[int(i) for i in index]}: got {float(c.reshape(-1)[flat]):.6g}, expected {float(h.reshape(-1)[flat]):.6g}; "
            f"max abs err {float(err.max()):.3g}")
