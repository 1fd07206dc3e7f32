"""kernforge.sandbox: run untrusted code in isolated, pre-started worker processes.

Standard library only; knows nothing about kernels. See protocol.py for the contract.
"""

from .protocol import (
    Backend,
    Channel,
    Diagnostics,
    FailureKind,
    Limits,
    SandboxError,
    Session,
    WorkerFailure,
    WorkerSpec,
)

__all__ = [
    "Backend", "Channel", "Diagnostics", "FailureKind", "Limits", "ProcessBackend", "SandboxError",
    "Session", "WorkerFailure", "WorkerSpec", "describe_isolation",
]


def __getattr__(name: str):
    # Imported lazily: `import kernforge.sandbox.worker` inside a worker must stay light.
    if name == "ProcessBackend":
        from .pool import ProcessBackend

        return ProcessBackend
    if name == "describe_isolation":
        from .isolation import describe_isolation

        return describe_isolation
    raise AttributeError(name)
