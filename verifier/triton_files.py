"""Which files of a Triton cache folder are a compiled kernel's, or its launcher's (triton_ahead.py
carries only those from a worker that compiled them ahead to the verdict's worker): checked on
both sides, in a module that imports nothing, since the candidate's worker checks them too
(harness.py)."""

from __future__ import annotations

import re
from typing import Any, Iterable

#: a Triton cache file: ``<key>/<name>``, the key a hash, the name a kernel's with a suffix
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
#: the files of a compiled kernel: its group, metadata, binary and the IRs Triton keeps beside it
KERNEL_SUFFIXES = (".json", ".cubin", ".ptx", ".ttir", ".ttgir", ".llir", ".source", ".hsaco", ".amdgcn")
#: a kernel's launcher: the C module Triton 3.6 generates from a kernel's signature and builds with
#: the host's compiler at the kernel's first launch, cached alone under its own key (the hash of
#: its source). No other shared object (Triton's driver module, built by every worker's warm-up
#: under the same key everywhere, and loaded) and nothing else
_LAUNCHER = re.compile(r"__triton_launcher(\.[A-Za-z0-9_-]+)*\.so")


#: an autotuner's pick, which Triton keeps in its cache where a kernel asks for ``cache_results``:
#: the worker ahead compiles every config and times them all alike (triton_ahead_worker.py), so
#: its pick would be the first config, and the verdict's worker would time that one instead of
#: the fastest. Never carried: the verdict's worker times the configs itself
AUTOTUNE_SUFFIX = ".autotune.json"


def kernel_file(name: str) -> bool:
    """Whether ``name`` is a file of a compiled kernel in a Triton cache (``KERNEL_SUFFIXES``, not
    an autotuner's pick: ``AUTOTUNE_SUFFIX``)."""
    return name.endswith(KERNEL_SUFFIXES) and not name.endswith(AUTOTUNE_SUFFIX)


def launcher_file(name: str) -> bool:
    """Whether ``name`` is a kernel's launcher module (``__triton_launcher[.<abi>].so``)."""
    return bool(_LAUNCHER.fullmatch(name))


def cache_name(name: Any) -> bool:
    """Whether ``name`` is a compiled kernel's file or a launcher in a Triton cache:
    ``<key>/<leaf>``, both plain names, the leaf one of ``KERNEL_SUFFIXES`` or a launcher's."""
    parts = name.split("/") if isinstance(name, str) else []
    return (len(parts) == 2 and all(_NAME.fullmatch(p) and p not in (".", "..") for p in parts)
            and (kernel_file(parts[1]) or launcher_file(parts[1])))


def whole_keys(names: Iterable[str]) -> bool:
    """Whether every key of these ``<key>/<leaf>`` names (``cache_name``s) holds a kernel's files
    only, or its launcher alone: what Triton writes under one key, never the two mixed."""
    leaves: dict[str, list[str]] = {}
    for name in names:
        key, _, leaf = name.partition("/")
        leaves.setdefault(key, []).append(leaf)
    return all(all(kernel_file(leaf) for leaf in group) or (len(group) == 1 and launcher_file(group[0]))
               for group in leaves.values())
