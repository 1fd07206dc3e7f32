"""Which check a verdict came from: a closed set, so lessons, prompts and queries can key on it.

A rejection names its check (``Rejected.check``); the archive stores the value under
``evidence["check"]``, the form older rows already use. Each check is decided by one defence in
``verifier/defences/``, which says which THREATS.md class it guards, what facts it reads and what
a candidate should do instead.
"""

from __future__ import annotations

from enum import Enum


class Check(str, Enum):
    # before the candidate runs
    STATIC_SCREEN = "static screen"
    EXTRACTION = "extraction"  # the model's reply held no usable module (the loop's own check)
    # the candidate's own failures
    COMPILE = "compile"
    RUNTIME = "runtime"
    OUT_OF_MEMORY = "oom"
    SANDBOX = "sandbox"
    # what the worker says about itself: early signals, never a reason to accept
    REPLY = "malformed reply"
    OUTPUT_TYPE = "output type"
    DISPATCH_MODE = "dispatch mode"
    INTEGRITY = "integrity"
    TASK_GLOBALS = "task globals"
    THREADS = "threads"
    PROCESSES = "processes"
    TORCH_OPS = "runtime trace"
    OWN_KERNELS = "own kernels"
    PERSISTING_L2 = "persisting L2"
    GRAPH_CAPTURE = "graph capture"
    # what trusted code measured or read itself
    OUTPUT_MEMORY = "output memory"
    OUTPUT_FORMAT = "output format"
    ALIASING = "aliasing"
    VALUES = "values"
    LATE_WRITES = "late writes"
    INPUT_MUTATION = "input mutation"
    REPEAT = "repeat"
    GRAPH_REPLAY = "graph replay"
    BATCH_PROBE = "batch probe"
    TRUSTED_CLOCK = "trusted clock"
    ROOFLINE = "roofline floor"
    AUDIT = "audit"
    NCU = "nsight compute"
    # older rows whose check string is none of the above
    OTHER = "other"

    @classmethod
    def parse(cls, value: object) -> "Check":
        """The check a stored string names; OTHER for anything unknown (older archives)."""
        if isinstance(value, Check):
            return value
        try:
            return cls(str(value))
        except ValueError:
            return _LEGACY.get(str(value), cls.OTHER)


#: check strings written by earlier versions of the judge
_LEGACY = {
    "protocol": Check.REPLY,
    "outputs": Check.OUTPUT_FORMAT,
    "output files": Check.OUTPUT_MEMORY,
    "input shapes": Check.TASK_GLOBALS,
    "timed outputs": Check.GRAPH_REPLAY,
    "timed checksums": Check.GRAPH_REPLAY,
    "graph contents": Check.GRAPH_CAPTURE,
    "wall clock": Check.TRUSTED_CLOCK,
    "stage": Check.RUNTIME,
}
