"""``kernforge doctor``: is a Docker engine reachable, and is the worker image there (and current)?

Never raises and never blocks more than a few seconds: the Docker SDK call runs in a daemon
thread that is abandoned if the engine does not answer in time.
"""

from __future__ import annotations

import os
import threading

WORKER_IMAGE = "kernforge-worker"
TIMEOUT_SECONDS = 4.0


def default_tag() -> str:
    """The worker image the docker backend runs: $KERNFORGE_SANDBOX_IMAGE, else kernforge-worker."""
    return os.environ.get("KERNFORGE_SANDBOX_IMAGE") or WORKER_IMAGE


def _probe(result: list) -> None:
    try:
        import docker
        from docker.errors import DockerException
    except ImportError as e:
        result.append((False, f"docker SDK not importable: {e}"))
        return
    try:
        from .docker_image import image_info

        client = docker.from_env(timeout=int(TIMEOUT_SECONDS))
        client.ping()
        version = client.version().get("Version", "?")
        try:
            info = image_info(client, default_tag())
            if info is None:
                result.append((False, f"engine {version} reachable, but image '{default_tag()}' is missing: "
                                      "`kernforge sandbox build-image` (--from-host without a registry)"))
            else:
                result.append((True, f"engine {version}; worker image {info.describe()}"))
        finally:
            client.close()
    except (DockerException, OSError) as e:
        result.append((False, f"no engine reachable: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"))
    except Exception as e:  # noqa: BLE001 - a doctor line must never become a traceback
        result.append((False, f"probe failed: {type(e).__name__}: {e}"[:300]))


def probe_docker() -> tuple[bool, str]:
    """(engine reachable and a worker image present, one line saying what was found)."""
    result: list[tuple[bool, str]] = []
    thread = threading.Thread(target=_probe, args=(result,), name="kernforge-docker-probe", daemon=True)
    thread.start()
    thread.join(TIMEOUT_SECONDS + 1.0)
    if not result:
        return False, f"docker engine did not answer within {TIMEOUT_SECONDS + 1:.0f}s"
    return result[0]
