"""Which files of a Triton cache folder are a compiled kernel's (triton_ahead.py carries only
those from a worker that compiled them ahead to the verdict's worker): checked on both sides, in
a module that imports nothing, since the candidate's worker checks them too (harness.py)."""

from __future__ import annotations

import re
from typing import Any

#: a Triton cache file: ``<key>/<name>``, the key a hash, the name a kernel's with a suffix
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
#: the files of a compiled kernel: its group, metadata, binary and the IRs Triton keeps beside it.
#: Never a shared object (Triton's launcher and driver modules are cached beside the kernels and
#: loaded into the process: the verdict's worker builds its own) nor anything else
KERNEL_SUFFIXES = (".json", ".cubin", ".ptx", ".ttir", ".ttgir", ".llir", ".source", ".hsaco", ".amdgcn")


def kernel_file(name: str) -> bool:
    """Whether ``name`` is a file of a compiled kernel in a Triton cache (``KERNEL_SUFFIXES``)."""
    return name.endswith(KERNEL_SUFFIXES)


def cache_name(name: Any) -> bool:
    """Whether ``name`` is a compiled kernel's file in a Triton cache: ``<key>/<leaf>``, both
    plain names, the leaf one of ``KERNEL_SUFFIXES``."""
    parts = name.split("/") if isinstance(name, str) else []
    return (len(parts) == 2 and all(_NAME.fullmatch(p) and p not in (".", "..") for p in parts)
            and kernel_file(parts[1]))
