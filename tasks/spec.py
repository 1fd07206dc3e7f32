"""What a task is: a KernelBench-form reference plus the metadata that says how to judge it.

A task is data plus a reference. The reference module (``Model``, ``get_inputs``,
``get_init_inputs``) is what the model is shown; the metadata module next to it holds what it
is never shown (hidden shapes) and how inputs, tolerances and the roofline are made. Nothing
here knows about sandboxes, verdicts or the loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

#: Input distributions a task may draw from. "default" means the reference's own
#: ``get_inputs()`` under a fixed seed (the only one a plain KernelBench file gets).
DISTRIBUTIONS = ("default", "normal", "uniform", "heavy_tailed", "large")

#: Device kinds a task declares a dtype and shapes for. "cpu" means the Triton interpreter.
DEVICE_KINDS = ("cuda", "cpu")


@dataclass(frozen=True, order=True)
class Shape:
    """One problem size: values for the reference module's integer globals (e.g. T, H)."""

    params: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, mapping: Mapping[str, int]) -> "Shape":
        return cls(tuple((str(k), int(v)) for k, v in mapping.items()))

    def as_dict(self) -> dict[str, int]:
        return dict(self.params)

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.params) or "(default)"

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True)
class Tolerance:
    """How far a candidate may be from the high-precision reference, per output element.

    An element passes when ``|c - h| <= rtol*|h| + atol*rms(h) + 2*|l - h|`` where ``h`` is the
    high-precision reference, ``l`` the reference computed in the task dtype (PyTorch eager's own
    rounding) and ``rms(h)`` the root-mean-square of the reference output. ``atol`` is relative to
    the output's scale so that a tiny output (a softmax over 150k entries) cannot pass as zeros.
    """

    atol: float
    rtol: float

    def to_dict(self) -> dict[str, float]:
        return {"atol": self.atol, "rtol": self.rtol}


#: Defaults by output dtype. bf16 keeps 8 significant bits: one rounding is at most 2^-9
#: relative, so 2^-7 leaves room for a different accumulation order but not for a whole
#: computation done in bf16. fp8 e4m3 keeps 4 bits: one ulp is 2^-3 relative.
DEFAULT_TOLERANCES: Mapping[str, Tolerance] = {
    "float64": Tolerance(atol=1e-9, rtol=1e-9),
    "float32": Tolerance(atol=1e-5, rtol=1e-4),
    "float16": Tolerance(atol=1e-3, rtol=2e-3),
    "bfloat16": Tolerance(atol=4e-3, rtol=8e-3),
    "float8_e4m3fn": Tolerance(atol=2e-2, rtol=0.13),
    "float8_e5m2": Tolerance(atol=4e-2, rtol=0.26),
    # Integers (ids, indices, counts) have no rounding: they match exactly.
    **{name: Tolerance(atol=0.0, rtol=0.0) for name in ("int64", "int32", "int16", "int8", "uint8", "bool")},
}


@dataclass(frozen=True)
class Roofline:
    """The least work a shape needs: bytes that must cross device memory and FLOPs."""

    bytes: float
    flops: float

    def floor_seconds(self, bandwidth_bps: float, flops_per_s: float) -> float:
        """The time no kernel can beat on hardware with these ceilings."""
        return max(self.bytes / bandwidth_bps, self.flops / flops_per_s)

    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else math.inf


@dataclass(frozen=True)
class LibraryBaseline:
    """A production kernel library's op timed beside eager and torch.compile (meta.py's
    ``LIBRARY_BASELINE``): ``package`` is the pip distribution (its version is reported),
    ``call`` the name of a function in meta.py called with the reference's forward inputs. It
    returns the reference's outputs, or, like the reference, writes the inputs the task
    mutates and returns None."""

    package: str
    call: str


@dataclass(frozen=True)
class Task:
    """A loaded task. Plain data; the modules behind it are loaded on demand (see runtime.py)."""

    name: str
    #: how to find this task again in another process: "builtin:NAME" or an absolute path
    ref: str
    reference_path: Path
    reference_source: str
    meta_path: Path | None = None
    description: str = ""
    public_shapes: tuple[Shape, ...] = ()
    hidden_shapes: tuple[Shape, ...] = ()
    cpu_public_shapes: tuple[Shape, ...] = ()
    cpu_hidden_shapes: tuple[Shape, ...] = ()
    distributions: tuple[str, ...] = ("default",)
    dtypes: Mapping[str, str] = field(default_factory=lambda: {"cuda": "float32", "cpu": "float32"})
    tolerances: Mapping[str, Tolerance] = field(default_factory=dict)
    allow_torch_ops: bool = False
    #: indices of inputs the op writes in place; they are compared like outputs
    mutated_inputs: tuple[int, ...] = ()
    seed_path: Path | None = None
    #: None when the seed runs under the Triton interpreter, else why it cannot
    interpreter_unsupported: str | None = None
    #: the library baselines where production kernel libraries cover the op, in the order they
    #: are preferred: the first installed one whose output agrees with the reference is timed
    libraries: tuple[LibraryBaseline, ...] = ()
    #: a plain KernelBench file, which gives no CPU shapes (its CPU shapes are its own sizes): the
    #: bytes of one call's inputs, outputs and weights there, measured on meta (None: not known)
    cpu_call_bytes: int | None = None

    def shapes(self, device_kind: str, *, hidden: bool) -> tuple[Shape, ...]:
        """Shapes to check on this kind of device. The interpreter gets the small CPU lists."""
        if device_kind == "cpu":
            return self.cpu_hidden_shapes if hidden else self.cpu_public_shapes
        return self.hidden_shapes if hidden else self.public_shapes

    def dtype(self, device_kind: str) -> str:
        return self.dtypes.get(device_kind, "float32")

    @property
    def library(self) -> LibraryBaseline | None:
        """The preferred library baseline (``libraries``' first), if any."""
        return self.libraries[0] if self.libraries else None

    def tolerance(self, dtype: str) -> Tolerance:
        if dtype in self.tolerances:
            return self.tolerances[dtype]
        return DEFAULT_TOLERANCES.get(dtype, DEFAULT_TOLERANCES["float32"])

    def tolerance_table(self) -> dict[str, dict[str, float]]:
        """Tolerance by output dtype, as outputs are judged (the verifier, the exported
        package's tests): floating dtypes by the task's table, integers exactly, any other
        dtype ("default") as float32."""
        floats = {"float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", *self.tolerances}
        table = {name: self.tolerance(name).to_dict() for name in sorted(floats)}
        table |= {exact: {"atol": 0.0, "rtol": 0.0} for exact in ("int64", "int32", "int16", "int8", "uint8", "bool")}
        return table | {"default": self.tolerance("float32").to_dict()}

    @property
    def seed_source(self) -> str | None:
        return self.seed_path.read_text() if self.seed_path else None

    def public_spec(self) -> dict[str, Any]:
        """Everything the model may be shown about this task, and nothing else."""
        return {
            "name": self.name,
            "description": self.description,
            "reference": self.reference_source,
            "public_shapes": [s.as_dict() for s in self.public_shapes],
            "dtypes": dict(self.dtypes),
            "tolerances": {d: self.tolerance(d).to_dict() for d in sorted({*self.dtypes.values(), *self.tolerances})},
            "allow_torch_ops": self.allow_torch_ops,
            "mutated_inputs": list(self.mutated_inputs),
        }
