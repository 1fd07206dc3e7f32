"""Which torch operations a candidate may use when its task forbids torch compute.

When a task sets ``allow_torch_ops = False`` the work must be done by the candidate's own
kernels (THREATS #16). The candidate still needs torch for bookkeeping around its launches, so
the policy splits torch into two parts:

* **bookkeeping**, allowed: operations whose result cannot depend on the *values* of an input
  except by copying them unchanged, in the same order, into the same positions:

  - *allocation*: ``empty``, ``empty_like``, ``empty_strided``, ``zeros``, ``ones``, ``full`` (and
    their ``_like`` / ``new_*`` forms), ``arange``, ``linspace``, ``eye``, ``tensor``/``as_tensor``,
    random fills (``randn``, ``uniform_``...). Their values come from constants or an RNG, never
    from an input: at most they make a degenerate output, which correctness catches (#2).
  - *views and metadata*: ``view``, ``reshape``, ``as_strided``, ``permute``, ``transpose``,
    ``expand``, ``squeeze``, ``select``, ``slice``, ``narrow``, ``split``, ``chunk``, ``unbind``,
    ``flatten``, ``detach``, ``size``/``stride``/``numel``/``data_ptr``... A view reinterprets
    memory; it moves and computes nothing, and every launcher needs shapes and strides.
  - *layout normalisation*: ``contiguous``, ``clone``, ``copy_``, ``to``/``_to_copy`` (dtype and
    device casts), ``fill_``/``zero_`` and ``item``. A kernel often needs a dense input or a
    zeroed accumulator (split-K, atomics); a single-tensor copy keeps every element where it was.

* **compute**, forbidden: everything else. Arithmetic, reductions, matmul/``bmm``/``addmm``/
  ``linear``, softmax, norms, activations, comparisons and ``where``, sorting and ``topk``, and
  also the data-movement ops that choose *which* element goes *where*: ``index_select``,
  ``gather``, ``scatter``, ``index_put``, ``masked_*``, ``take``, ``flip``, ``roll``, and ``cat``/
  ``stack``. ``cat`` is forbidden on purpose: it merges several tensors into a new one, which is
  the whole computation of concatenation-like serving ops (KV-cache packing, rotary halves), and a
  launcher never needs it (a kernel takes one pointer per tensor).

  Pure data-movement *tasks* (a transpose, a copy) are computed by bookkeeping ops themselves;
  such a task must describe its own policy, this table cannot.

Two views of one policy:

* Python names for the static screen (``verifier/screen.py``): :func:`torch_reference_kind` for a
  dotted path such as ``torch.nn.functional.relu`` and :func:`tensor_method_is_compute` for a
  method name such as ``.sum``. Operators (``a + b``, ``a[idx]``) cannot be judged from syntax
  (launchers do integer arithmetic too); the runtime trace sees them as ``aten::add``,
  ``aten::index``. Only ``@`` is screened, since a launcher never multiplies matrices.
* aten op names for the runtime trace (a ``TorchDispatchMode``): :func:`is_allowed_aten`.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Literal, Sequence

# --------------------------------------------------------------------------------------------
# Bookkeeping, by kind. Names are aten op names; most Python names match them one to one.

ALLOCATION = frozenset({
    "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
    "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like",
    "new_full", "arange", "range", "linspace", "logspace", "eye", "scalar_tensor",
    # torch.tensor(data) and torch.as_tensor(data) reach aten as lift_fresh
    "lift", "lift_fresh", "lift_fresh_copy",
    # values from an RNG, never from an input
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
    "uniform_", "normal_", "random_", "exponential_", "cauchy_", "log_normal_", "geometric_",
})

VIEWS = frozenset({
    "view", "view_as", "_unsafe_view", "reshape", "reshape_as", "_reshape_alias", "as_strided",
    "as_strided_", "permute", "transpose", "transpose_", "t", "t_", "adjoint", "mT", "numpy_T",
    "expand", "expand_as", "broadcast_to", "broadcast_tensors", "squeeze", "squeeze_",
    "unsqueeze", "unsqueeze_", "select", "slice", "narrow", "split", "split_with_sizes",
    "unsafe_split", "unsafe_split_with_sizes", "tensor_split", "hsplit", "vsplit", "dsplit",
    "chunk", "unsafe_chunk", "unbind", "flatten", "unflatten", "ravel", "movedim", "moveaxis",
    "swapaxes", "swapaxes_", "swapdims", "swapdims_", "atleast_1d", "atleast_2d", "atleast_3d",
    "unfold", "diagonal", "view_as_real", "view_as_complex", "real", "imag", "alias", "detach",
    "detach_", "_fw_primal", "meshgrid",
    # the functional "_copy" variants materialise a view: a copy, nothing more
    "view_copy", "_reshape_alias_copy", "as_strided_copy", "permute_copy", "transpose_copy",
    "t_copy", "expand_copy", "squeeze_copy", "unsqueeze_copy", "select_copy", "slice_copy",
    "narrow_copy", "split_copy", "split_with_sizes_copy", "unbind_copy", "unfold_copy",
    "diagonal_copy", "alias_copy", "detach_copy", "view_as_real_copy", "view_as_complex_copy",
})

METADATA = frozenset({
    "size", "stride", "numel", "dim", "is_contiguous",
    "storage_offset", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
    "is_complex", "is_floating_point", "is_signed", "is_inference", "is_conj", "is_neg",
    "is_same_size", "is_pinned", "is_nonzero", "_has_compatible_shallow_copy_type", "output_nr",
    "_version", "is_leaf", "data", "requires_grad_", "retain_grad", "record_stream",
    "_assert_tensor_metadata", "get_device",
})

MOVEMENT = frozenset({
    "contiguous", "clone", "copy", "copy_", "_copy_from", "_copy_from_and_resize", "to",
    "_to_copy", "type_as", "fill_", "zero_", "resize_", "resize_as_", "_resize_output_",
    "_pin_memory", "pin_memory", "_local_scalar_dense", "item",
})

#: aten op names (without namespace or overload) that are bookkeeping
ALLOWED_ATEN = ALLOCATION | VIEWS | METADATA | MOVEMENT

#: prims ops that only allocate, view or copy (seen only when a decomposition runs)
ALLOWED_PRIMS = frozenset({
    "view_of", "view_of_dtype", "broadcast_in_dim", "squeeze", "transpose", "reshape",
    "collapse_view", "split_dim", "as_strided", "empty", "empty_strided", "empty_permuted", "full",
    "full_like", "iota", "scalar_tensor", "convert_element_type", "device_put", "copy_to",
    "copy_strided", "clone", "resize", "fill", "uniform", "item",
})

#: torch's own op namespaces besides aten/prims: their ops compute (collectives, quantized
#: kernels, fused CPU kernels) and are never the candidate's own
TORCH_COMPUTE_NAMESPACES = frozenset({
    "quantized", "_quantized", "quantized_decomposed", "mkldnn", "mkl", "onednn", "xnnpack",
    "fbgemm", "_c10d_functional", "_c10d_functional_autograd", "c10d", "_dtensor", "symm_mem",
    "inductor", "debugprims", "rngprims", "static_runtime", "sparse",
})

#: other libraries' kernels: a candidate that calls them is not using its own kernels
FOREIGN_NAMESPACES = frozenset({
    "_C", "_moe_C", "_rocm_C", "_vllm_fa2_C", "_vllm_fa3_C", "vllm", "sgl_kernel", "sglang",
    "flashinfer", "flash_attn", "_flash_attn_forward", "xformers", "xformers_flash", "torchvision",
    "torchaudio", "torchao", "fbgemm_gpu", "liger_kernel", "transformer_engine", "trtllm",
    "megablocks", "deep_gemm", "bitsandbytes",
})

#: higher-order ops that only wrap a candidate's own Triton kernel (torch.library.triton_op)
ALLOWED_HIGHER_ORDER = frozenset({"triton_kernel_wrapper_mutation", "triton_kernel_wrapper_functional"})


def parse_op_name(op_name: Any) -> tuple[str, str, str]:
    """``(namespace, name, overload)`` from any spelling a trace produces.

    ``"aten::mm"``, ``"aten::mm.out"``, ``"aten.mm.default"``, ``"torch.ops.aten.mm.default"``,
    an ``OpOverload`` object, or a bare ``"mm"`` (taken as aten).
    """
    if not isinstance(op_name, str):
        name_fn = getattr(op_name, "name", None)
        op_name = name_fn() if callable(name_fn) else str(op_name)
    text = op_name.strip()
    if text.startswith("torch.ops."):
        text = text[len("torch.ops."):]
    if "::" in text:
        namespace, _, rest = text.partition("::")
        name, _, overload = rest.partition(".")
        return namespace, name, overload
    parts = text.split(".")
    if len(parts) == 1:
        return "aten", parts[0], ""
    return parts[0], parts[1], ".".join(parts[2:])


def is_allowed_aten(op_name: Any) -> bool:
    """Whether an op seen by the runtime trace is bookkeeping (True) or compute (False).

    aten and prims ops follow the tables above. Other torch namespaces and known libraries'
    namespaces (vLLM's ``_C``, ``flash_attn``...) are compute. Any other namespace is taken to be
    the candidate's own custom op (``TORCH_LIBRARY`` in its ``load_inline`` source, or
    ``torch.library.custom_op``): allowed, because the ops its implementation dispatches are
    traced one by one and judged here too.
    """
    namespace, name, _ = parse_op_name(op_name)
    if namespace == "aten":
        return name in ALLOWED_ATEN
    if namespace == "prims":
        return name in ALLOWED_PRIMS
    if namespace == "higher_order":
        return name in ALLOWED_HIGHER_ORDER
    if namespace in TORCH_COMPUTE_NAMESPACES or namespace in FOREIGN_NAMESPACES:
        return False
    return True


# --------------------------------------------------------------------------------------------
# Python names, for the static screen.

#: callables under ``torch.`` that are not ops at all: grad modes, RNG seeding, dtype
#: arithmetic, settings. (Classes, modules, dtypes and constants are recognised by type.)
TORCH_UTILITIES = frozenset({
    "is_tensor", "is_storage", "is_grad_enabled", "is_inference_mode_enabled",
    "is_autocast_enabled", "get_default_dtype", "set_default_dtype", "get_default_device",
    "set_default_device", "manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state",
    "use_deterministic_algorithms", "are_deterministic_algorithms_enabled",
    "is_deterministic_algorithms_warn_only_enabled", "set_float32_matmul_precision",
    "get_float32_matmul_precision", "set_printoptions", "set_grad_enabled", "get_num_threads",
    "set_num_threads", "get_num_interop_threads", "set_num_interop_threads", "typename",
    "result_type", "promote_types", "can_cast", "broadcast_shapes", "compiled_with_cxx11_abi",
    "_assert", "_check", "_check_index", "_check_value", "_check_type", "_check_is_size",
    "sym_int", "sym_float", "sym_max", "sym_min", "sym_not", "sym_sum", "get_device",
    "is_warn_always_enabled", "set_warn_always", "get_deterministic_debug_mode",
    "set_deterministic_debug_mode",
})

#: ``torch.`` submodules every name of which is compute (ops, or classes that run ops)
TORCH_COMPUTE_SUBMODULES = frozenset({
    "special", "linalg", "fft", "sparse", "masked", "nested", "distributions", "_refs", "_prims",
    "_decomp", "func", "functional",
})

#: ``torch.nn`` classes that hold parameters or other modules and compute nothing themselves
NN_CONTAINERS = frozenset({
    "Module", "ModuleList", "ModuleDict", "Sequential", "ParameterList", "ParameterDict",
    "Parameter", "Buffer", "UninitializedParameter", "UninitializedBuffer", "Identity",
    "Flatten", "Unflatten",
})

#: ``torch.nn`` submodules that are not ops: parameter initialisation and helpers
NN_NON_OP_SUBMODULES = frozenset({"init", "utils", "parameter", "common_types", "modules"})

#: ``torch.autograd`` names that run ops (the rest is the custom-Function machinery)
AUTOGRAD_COMPUTE = frozenset({"grad", "backward", "functional", "forward_ad", "gradcheck"})

#: ``torch.nn.attention`` names that only select a backend
NN_ATTENTION_NON_OPS = frozenset({"sdpa_kernel", "SDPBackend"})


def is_bookkeeping(name: str) -> bool:
    """Whether a Python-level torch function or tensor method name is bookkeeping."""
    return name in ALLOWED_ATEN or name in _PYTHON_ONLY_BOOKKEEPING


#: Python-level spellings that reach the bookkeeping aten ops above through composites
#: (``x.half()`` is ``_to_copy``, ``torch.tensor`` is ``lift_fresh``) or never reach aten at all
#: (``data_ptr``, ``element_size``)
_PYTHON_ONLY_BOOKKEEPING = frozenset({
    "type", "cpu", "cuda", "float", "double", "half", "bfloat16", "int", "long", "short", "char",
    "byte", "bool", "cfloat", "cdouble", "new_tensor", "tensor", "as_tensor", "asarray",
    "from_numpy", "frombuffer", "data_ptr", "element_size", "nelement", "ndimension",
    "untyped_storage", "dim_order", "is_set_to", "is_shared", "storage", "ndim", "T", "mT",
})


@functools.lru_cache(maxsize=None)
def _torch_object(path: tuple[str, ...]) -> Any:
    """The object a dotted torch path names in this process's torch, or None."""
    try:
        import importlib

        obj: Any = importlib.import_module(path[0])
        for part in path[1:]:
            obj = getattr(obj, part)
        return obj
    except Exception:  # noqa: BLE001 - any failure means "not a known object"
        return None


def _is_op_object(obj: Any) -> bool:
    """Functions and builtins are ops; modules, classes, dtypes and constants are not."""
    if obj is None:
        return True  # unknown name: it would fail at run time; treat it as an op
    if isinstance(obj, (types.ModuleType, type)):
        return False
    return callable(obj)


def _op_in_namespace(namespace: tuple[str, ...], name: str, allowed: frozenset[str]) -> bool:
    if name in allowed or name.startswith("__"):
        return False
    return _is_op_object(_torch_object(namespace + (name,)))


def torch_reference_kind(path: Sequence[str]) -> Literal["compute", "layer"] | None:
    """Classify a dotted name rooted at ``torch`` (``("torch", "nn", "functional", "relu")``).

    ``"compute"``: an op or op namespace member that computes (forbidden when torch ops are).
    ``"layer"``: an ``nn.Module`` class that computes when *called* (``nn.Linear``); building one
    only to own its parameters, as KernelBench candidates do, is fine.
    ``None``: bookkeeping, a class, a module, a dtype, a setting.
    Trailing attributes after the op (``torch.matmul.__doc__``) classify as the op.
    """
    path = tuple(path)
    if len(path) < 2 or path[0] != "torch":
        return None
    head = path[1]
    if head in TORCH_COMPUTE_SUBMODULES:
        if len(path) == 2 or is_bookkeeping(path[2]) or path[2].startswith("__"):
            return None
        return "compute"
    if head == "nn":
        return _nn_kind(path)
    if head == "Tensor" or path[1:3] in (("_C", "TensorBase"), ("_C", "_TensorBase")):
        ns = path[:2] if head == "Tensor" else path[:3]
        if len(path) == len(ns):
            return None
        name = path[len(ns)]
        return "compute" if tensor_method_is_compute(name, include_ambiguous=True) else None
    if head == "_C" and len(path) >= 4 and path[2] in ("_VariableFunctions", "_nn", "_special",
                                                       "_linalg", "_fft", "_nested", "_sparse"):
        allowed = ALLOWED_ATEN | TORCH_UTILITIES if path[2] == "_VariableFunctions" else frozenset()
        return "compute" if path[3] not in allowed and not path[3].startswith("__") else None
    if head == "ops" and len(path) >= 4:
        namespace, name = path[2], path[3]
        return None if is_allowed_aten(f"{namespace}::{name}") else "compute"
    if head == "autograd" and len(path) >= 3:
        return "compute" if path[2] in AUTOGRAD_COMPUTE else None
    # a name directly under torch: an op unless it is bookkeeping, a utility, or not callable
    if is_bookkeeping(head) or head in TORCH_UTILITIES:
        return _alias_kind(path)
    return "compute" if _op_in_namespace(("torch",), head, frozenset()) else _alias_kind(path)


@functools.lru_cache(maxsize=1)
def _op_index() -> dict[int, tuple[str, ...]]:
    """Every op object of torch's op namespaces, by identity, with its canonical path."""
    index: dict[int, tuple[str, ...]] = {}
    for ns in (("torch", "nn", "functional"), ("torch", "special"), ("torch", "linalg"), ("torch", "fft"), ("torch",)):
        module = _torch_object(ns)
        for name in dir(module) if module is not None else ():
            obj = getattr(module, name, None)
            if not name.startswith("__") and callable(obj) and not isinstance(obj, (type, types.ModuleType)):
                index.setdefault(id(obj), ns + (name,))
    return index


def _alias_kind(path: tuple[str, ...]) -> Literal["compute"] | None:
    """A path that reaches an op under another name (``torch.nn.modules.activation.F.relu``)."""
    for n in range(len(path), 2, -1):
        obj = _torch_object(path[:n])
        canonical = _op_index().get(id(obj)) if obj is not None else None
        if canonical is not None and canonical != path[:n]:
            return "compute" if torch_reference_kind(canonical) == "compute" else None
    return None


def _nn_kind(path: tuple[str, ...]) -> Literal["compute", "layer"] | None:
    if len(path) == 2:
        return None
    sub = path[2]
    if sub in ("functional", "grad"):
        if len(path) == 3:
            return None
        return "compute" if _op_in_namespace(path[:3], path[3], frozenset()) else None
    if sub == "attention":
        if len(path) == 3:
            return None
        return None if path[3] in NN_ATTENTION_NON_OPS else "compute"
    if sub == "modules":
        classes = [p for p in path[3:] if p[:1].isupper()]
        if classes and _nn_class_kind(classes[0]) == "layer":
            return "layer"
        return _alias_kind(path)
    if sub in NN_NON_OP_SUBMODULES:
        return _alias_kind(path)
    return _nn_class_kind(sub)


def _nn_class_kind(name: str) -> Literal["layer"] | None:
    if name in NN_CONTAINERS:
        return None
    cls = _torch_object(("torch", "nn", name))
    try:
        import torch

        if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
            return "layer"
    except ImportError:
        return "layer" if name[:1].isupper() else None
    return None


@functools.lru_cache(maxsize=1)
def _tensor_methods() -> frozenset[str]:
    try:
        import torch

        return frozenset(dir(torch.Tensor))
    except ImportError:
        return frozenset()


@functools.lru_cache(maxsize=1)
def _builtin_method_names() -> frozenset[str]:
    """Method names of Python's own containers and scalars (``list.sort``, ``set.add``...)."""
    names: set[str] = set()
    for t in (list, dict, set, frozenset, str, bytes, bytearray, int, float, complex, tuple):
        names.update(dir(t))
    return frozenset(names)


#: methods that hand a tensor's values to the host or another library, where the screen
#: cannot follow what computes on them
HOST_EXPORT_METHODS = frozenset({"numpy", "tolist", "__array__", "__dlpack__"})


def tensor_method_is_compute(name: str, *, include_ambiguous: bool = False) -> bool:
    """Whether ``x.name(...)`` computes when ``x`` is a tensor.

    The screen cannot see the receiver's type, so names that Python's own types also have
    (``list.sort``, ``set.add``, ``str.split``) are not flagged unless ``include_ambiguous``
    (used for ``torch.Tensor.sort``, whose receiver is known). Dunders are operators: the
    runtime trace judges those.
    """
    if name.startswith("__") or name in HOST_EXPORT_METHODS:
        return False
    if is_bookkeeping(name):
        return False
    if name not in _tensor_methods():
        return False
    if not include_ambiguous and name in _builtin_method_names():
        return False
    return True


# --------------------------------------------------------------------------------------------
# C++ (load_inline sources): free functions of the ATen API.


@functools.lru_cache(maxsize=1)
def _aten_op_names() -> frozenset[str]:
    try:
        import torch

        return frozenset(n.split("::", 1)[1].split(".", 1)[0]
                         for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::"))
    except Exception:  # noqa: BLE001 - an older torch without the helper: nothing is known
        return frozenset()


def cpp_call_is_compute(name: str) -> bool:
    """Whether ``at::name(...)`` / ``torch::name(...)`` in C++ is an aten compute op.

    Only registered aten ops count, so helpers such as ``torch::dtype`` or ``at::globalContext``
    are never flagged.
    """
    return name in _aten_op_names() and name not in ALLOWED_ATEN
