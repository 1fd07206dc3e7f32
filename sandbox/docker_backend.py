"""DockerBackend: the process backend's worker, protocol and warm pool, in containers.

Each worker is one container of the worker image (``kernforge sandbox build-image``) running the
same generic worker (``kernforge.sandbox.worker``, entered through docker_entry.py) with the
same channels: two FIFOs, a control socket and the descriptor channel's socket in the worker's
private folder, which is bound into the container at the same absolute path (see
docker_worker.py). Containers are started ahead
of time by the process backend's pool thread (preloaded and warmed up like process workers) and
refilled in the background; sessions are the process backend's sessions.

Every container gets: no network (``network_mode=none``), a read-only root with private tmpfs
``/tmp``, ``/var/tmp`` and ``/dev/shm``, all capabilities dropped, ``no-new-privileges``, a
memory cgroup cap and a pid limit, its own pid and IPC namespaces, a non-root user (a private uid
per worker when the parent is root), at most one GPU (docker_gpu.py), and nothing of the host but
its private folder, the host folders a ``--from-host`` image names (read-only) and the folders on
the spec's PYTHONPATH (read-only). The parent's host-side policing is unchanged: the wall-clock
deadline and the memory of the container's process tree are checked from outside, and a failure
kills the container's init through a pidfd, which ends its whole pid namespace.

Nothing is left behind: containers are auto-removed when their init exits, which it does when the
parent closes the control socket, including when the parent is killed; a backend removes the
containers labelled with its id when it closes (also at exit); and every backend, when it starts,
removes containers and private folders whose owning process no longer exists.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, Mapping

from docker.errors import DockerException
from requests.exceptions import RequestException

from . import docker_gpu, docker_image, procs
from .procs import owner_alive, owner_id  # noqa: F401  (the owner label of containers; tests)
from .docker_probe import default_tag
from .docker_worker import PRIVATE_PREFIX, ContainerPlan, DockerWorker, Engine, call_quietly
from .env import worker_env
from .isolation import TMPFS_BYTES, Mechanism, checkout_metadata, package_extras, under
from .pool import ProcessBackend
from .protocol import FailureKind, Limits, SandboxError, WorkerSpec
from .session import GRACE_SECONDS, ProcessSession
from .spawn import WARM_NICE, remove_stale_private_dirs

LABEL_ROLE = "org.kernforge.sandbox"
LABEL_OWNER = "org.kernforge.owner"
LABEL_BACKEND = "org.kernforge.backend"
LABEL_DEVICE = "org.kernforge.device"
MECHANISM = Mechanism("docker", "docker containers", netns=True, pidns=True, mountns=True)
#: Parent variables that name host paths: a container takes these from its image instead.
HOST_SPECIFIC = frozenset({"PATH", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH",
                           "CC", "CXX", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDNN_HOME", "ROCM_PATH", "HIP_PATH",
                           "PYTHONPATH"})
#: How long ``close`` waits for the engine to finish removing this backend's containers.
REMOVAL_WAIT_SECONDS = 60.0

log = logging.getLogger(__name__)


class DockerSession(ProcessSession):
    """A process-backend session whose worker is a container: an OOM kill in the container's
    memory cgroup is reported as such rather than as an unexplained SIGKILL."""

    def _finish(self, closed_channel: bool = False) -> None:
        self._collect_report(GRACE_SECONDS)
        if self.worker.oom_killed():
            self.fail(FailureKind.OUT_OF_MEMORY, f"the container's memory cap of {self.worker.plan.memory_bytes >> 20} MiB "
                                                 "was reached (the kernel's OOM killer ended the job)")
        super()._finish(closed_channel)


class DockerBackend(ProcessBackend):
    """Workers in containers of ``image`` (default: $KERNFORGE_SANDBOX_IMAGE, else
    kernforge-worker). ``memory_bytes`` and ``processes`` set each container's cgroup caps
    (defaults: ``Limits()``'s, with headroom); a session's own, usually lower, limits are
    enforced as with the process backend."""

    name = "docker"
    session_class = DockerSession

    def __init__(self, spec: WorkerSpec, pool_size: int = 1, *, refill: bool = True, start_timeout: float = 600.0,
                 image: str | None = None, memory_bytes: int | None = None, processes: int | None = None):
        if spec.profiler:
            raise SandboxError("a profiled worker runs in the process sandbox only (its profiler must be its parent)")
        image = image or default_tag()
        self.engine = Engine(docker_image.client())
        with docker_image.engine_errors(f"preparing docker workers of {image}"):
            self._prepare(spec, image, memory_bytes, processes)
        super().__init__(spec, pool_size, refill=refill, start_timeout=start_timeout, mechanism=MECHANISM)
        self.drop_uid = self.plan.lease_uids

    def _prepare(self, spec: WorkerSpec, image: str, memory_bytes: int | None, processes: int | None) -> None:
        info = docker_image.image_info(self.engine.client, image)
        if info is None:
            raise SandboxError(f"the worker image '{image}' is missing: build it with `kernforge sandbox build-image` "
                               "(`--from-host` where no registry is reachable)")
        missing = [p for p in info.host_paths if not os.path.isdir(p)]
        if missing:
            raise SandboxError(f"the worker image binds host folders this machine lacks ({', '.join(missing)}): "
                               "it was built on another machine; rebuild it here with --from-host")
        self.image = info
        self.backend_id = uuid.uuid4().hex[:12]
        removed = sweep_stale(self.engine)
        if removed:
            log.info("removed %d worker containers of kernforge processes that no longer exist", removed)
        self.plan, self.gpu_detail = self._plan(spec, info, memory_bytes, processes)

    # ---- the container every worker gets ---------------------------------------------------------
    def _plan(self, spec: WorkerSpec, info: docker_image.ImageInfo, memory_bytes: int | None,
              processes: int | None) -> tuple[ContainerPlan, str]:
        parent = {k: v for k, v in os.environ.items() if k not in HOST_SPECIFIC}
        env = worker_env(spec, Path("/nonexistent"), parent)
        if "PATH" not in spec.env:
            env.pop("PATH", None)  # the image's PATH leads to its interpreter
        code_paths = [p for p in spec.env.get("PYTHONPATH", "").split(":") if p]
        for p in code_paths:
            if not os.path.isabs(p) or not os.path.isdir(p) or ":" in p:
                raise SandboxError(f"WorkerSpec PYTHONPATH entry {p!r}: a docker worker needs absolute, existing folders")
        env["PYTHONPATH"] = ":".join([p for p in info.env.get("PYTHONPATH", "").split(":") if p] + code_paths)
        env["USER"] = env["LOGNAME"] = "kernforge"
        binds = [f"{p}:{p}:ro" for p in info.host_paths] + [f"{p}:{p}:ro" for p in code_paths]
        plan_kwargs: dict[str, Any] = {}
        detail = "CPU only"
        if spec.device != "cpu":
            gpu = docker_gpu.plan(spec.device, self.engine.call("info"), info.env)
            env.update(gpu.env)
            binds += list(gpu.binds)
            plan_kwargs = {"device_requests": gpu.device_requests, "devices": gpu.devices, "group_add": gpu.group_add}
            detail = gpu.detail
        hidden_dirs, hidden_files = [], []
        if info.stale:
            # Built from other kernforge sources: this kernforge's worker packages are bound over the
            # image's copy, so parent and worker always speak the same protocol.
            overlay = docker_image.worker_package_binds()
            binds += overlay.binds
            hidden_dirs += overlay.hidden_dirs
            log.info("worker image %s: binding this kernforge's worker packages over its copy", info.describe())
        sources = [b.split(":", 1)[0] for b in binds]
        # As with the process backend, the parent's home is hidden from untrusted workers; here it
        # matters only where a bound folder holds it.
        home = (os.path.expanduser("~"),) if spec.isolation != "none" else ()
        vcs = checkout_metadata(sources) + package_extras() if spec.isolation != "none" else ()
        bound = {os.path.realpath(s) for s in sources}
        for h in spec.hidden_paths + home + vcs:
            real = os.path.realpath(h)
            # a folder bound in whole (PYTHONPATH's) is one the worker needs: never hidden whole
            if real not in bound and os.path.exists(real) and any(under(real, s) for s in sources):
                (hidden_dirs if os.path.isdir(real) else hidden_files).append(real)
        limits = Limits()
        memory = memory_bytes or limits.memory_bytes
        # Headroom: the parent's poller, which classifies and reports, normally acts first.
        cap = memory + max(memory // 4, 256 * 1024**2)
        nice = WARM_NICE if os.geteuid() == 0 and _engine_processes_visible() else 0
        worker = {"preload": list(spec.preload), "warmup": spec.warmup, "strict": spec.isolation != "none",
                  "pidns": True, "uid": None, "gid": None, "groups": [], "plan": None, "tmpfs_bytes": TMPFS_BYTES,
                  "fork": spec.fork,
                  "nice": nice}
        labels = {LABEL_ROLE: "worker", LABEL_OWNER: owner_id(), LABEL_BACKEND: self.backend_id, LABEL_DEVICE: spec.device}
        plan = ContainerPlan(image=info.id, python=info.python, binds=tuple(binds), env=env, labels=labels,
                             memory_bytes=cap, pids=(processes or limits.processes) + 64, tmpfs_bytes=TMPFS_BYTES,
                             lease_uids=os.geteuid() == 0, worker=worker, hidden_dirs=tuple(hidden_dirs),
                             hidden_files=tuple(hidden_files), **plan_kwargs)
        return plan, detail

    def describe(self) -> str:
        """One line: what a worker of this backend gets."""
        user = "a private uid per worker" if self.plan.lease_uids else f"uid {os.getuid()} (the parent's)"
        return (f"docker: image {self.image.describe()}; no network, read-only root, all capabilities dropped, "
                f"no-new-privileges, memory cap {self.plan.memory_bytes >> 20} MiB, {self.plan.pids} pids, {user}; "
                f"{self.gpu_detail}")

    # ---- the pool (ProcessBackend's, with containers for processes) ------------------------------
    def _new_worker(self) -> DockerWorker:
        try:
            return DockerWorker(self.plan, self.engine)
        except DockerException as e:
            text = getattr(e, "explanation", None) or str(e)
            if self.plan.python in text and "no such file or directory" in text:
                raise SandboxError(
                    f"the worker image {self.image.tag} starts its workers with {self.plan.python}, which its "
                    "containers do not have (an image built from a virtual environment by an older kernforge, or "
                    "on another machine): rebuild it with `kernforge sandbox build-image --from-host --force`"
                ) from None
            raise SandboxError(f"the engine refused a worker container: {text}") from None
        except RequestException as e:
            raise SandboxError(f"the Docker engine did not answer while starting a worker ({e})") from None

    def _monitor(self, busy: list[ProcessSession]) -> None:
        visible = [s for s in busy if s.worker.host_pid is not None and s.worker.alive()]
        snapshot = procs.snapshot() if visible else {}
        now = time.monotonic()
        for session in busy:
            if session.failed:
                continue
            rss = procs.tree_rss(session.worker.host_pid, snapshot) if session in visible else 0
            session.check(now, rss)

    def close(self) -> None:
        """Stop every worker and remove every container this backend started."""
        super().close()
        try:
            remove_containers(self.engine, {LABEL_BACKEND: self.backend_id}, wait=REMOVAL_WAIT_SECONDS)
        except (DockerException, RequestException, SandboxError) as e:  # the next backend's sweep removes them
            log.warning("removing this backend's containers: %s", e)


# ---- owners and sweeping -------------------------------------------------------------------------
def _engine_processes_visible() -> bool:
    """Whether this process sees the engine's processes (and so its containers') in /proc."""
    for pidfile in ("/run/docker.pid", "/var/run/docker.pid"):
        try:
            with open(pidfile) as f:
                pid = int(f.read().strip())
            with open(f"/proc/{pid}/comm") as f:
                return f.read().strip() == "dockerd"
        except (OSError, ValueError):
            continue
    return False


def remove_containers(engine: Engine, labels: Mapping[str, str], wait: float = 0.0) -> int:
    """Force-remove every container carrying ``labels``; with ``wait``, until none is left."""
    filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
    deadline = time.monotonic() + wait
    removed = 0
    while True:
        found = engine.call("containers", all=True, filters=filters)
        if not found:
            return removed
        for container in found:
            removed += call_quietly(engine, "remove_container", container["Id"], force=True)
        if time.monotonic() >= deadline:
            return removed
        time.sleep(0.1)


def sweep_stale(engine: Engine) -> int:
    """Remove worker containers and private folders of kernforge processes that no longer exist
    (killed before they could clean up). Returns how many containers went."""
    removed = 0
    for container in engine.call("containers", all=True, filters={"label": f"{LABEL_ROLE}=worker"}):
        if owner_alive((container.get("Labels") or {}).get(LABEL_OWNER, "")):
            continue
        try:
            removed += call_quietly(engine, "remove_container", container["Id"], force=True)
        except SandboxError as e:
            log.warning("cannot remove a stale container: %s", e)
    remove_stale_private_dirs(PRIVATE_PREFIX)
    return removed
