"""The docker backend's pieces that need no engine (GPU flags, the host base's file list, owners),
and the few that need one but no worker (the image build's cache, the CLI, doctor)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernforge.sandbox import SandboxError
from kernforge.sandbox import docker_gpu, docker_hostbase, docker_image
from kernforge.sandbox.docker_backend import owner_alive, owner_id

LDCONFIG = """\
1234 libs found in cache `/etc/ld.so.cache'
\tlibnvidia-ptxjitcompiler.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1
\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
\tlibnvidia-ml.so.1 (libc6) => /usr/lib/i386-linux-gnu/libnvidia-ml.so.1
\tlibnvidia-egl-wayland.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-egl-wayland.so.1
\tlibcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12
\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1
\tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6
"""
SMI = "0, GPU-aaaa, 3\n1, GPU-bbbb, 0\n"


def test_driver_libraries_are_the_native_driver_ones():
    found = docker_gpu.driver_libraries(LDCONFIG)
    assert found == {
        "libnvidia-ptxjitcompiler.so.1": "/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1",
        "libnvidia-ml.so.1": "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "libcuda.so.1": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    }, "32-bit copies, the CUDA runtime (in the image) and graphics libraries stay out"


@pytest.mark.parametrize("physical, minor", [("0", 3), ("1", 0), ("GPU-bbbb", 0), ("GPU-aaaa", 3)])
def test_gpu_minor_follows_nvidia_smi(physical, minor):
    assert docker_gpu.gpu_minor(physical, SMI) == minor


def test_gpu_minor_without_nvidia_smi():
    assert docker_gpu.gpu_minor("2", None) == 2
    with pytest.raises(SandboxError, match="GPU-cccc"):
        docker_gpu.gpu_minor("GPU-cccc", SMI)


def test_explicit_gpu_plan_passes_one_gpu_and_the_driver():
    libraries = docker_gpu.driver_libraries(LDCONFIG)
    plan = docker_gpu.explicit_plan("1", "/dev/nvidia0", ["/dev/nvidiactl", "/dev/nvidia-uvm"], libraries,
                                    {"LD_LIBRARY_PATH": "/opt/conda/lib"}, (44,))
    assert plan.devices == ("/dev/nvidia0:/dev/nvidia0:rwm", "/dev/nvidiactl:/dev/nvidiactl:rwm",
                            "/dev/nvidia-uvm:/dev/nvidia-uvm:rwm")
    assert not plan.device_requests
    d = docker_gpu.DRIVER_DIR
    assert f"/usr/lib/x86_64-linux-gnu/libcuda.so.1:{d}/libcuda.so:ro" in plan.binds, "-lcuda needs the plain name"
    assert f"/usr/lib/x86_64-linux-gnu/libcuda.so.1:{d}/libcuda.so.1:ro" in plan.binds
    assert all(b.endswith(":ro") for b in plan.binds)
    assert plan.env["LD_LIBRARY_PATH"] == f"{d}:/opt/conda/lib" and plan.env["TRITON_LIBCUDA_PATH"] == d
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0" and plan.group_add == ("44",)


def test_explicit_gpu_plan_needs_the_driver():
    with pytest.raises(SandboxError, match="libcuda"):
        docker_gpu.explicit_plan("0", "/dev/nvidia0", [], {}, {}, ())


def test_runtime_gpu_plan_requests_exactly_that_gpu():
    plan = docker_gpu.runtime_plan("GPU-bbbb")
    assert plan.device_requests == ({"Driver": "nvidia", "Count": 0, "DeviceIDs": ["GPU-bbbb"],
                                     "Capabilities": [["gpu"]], "Options": {}},)
    assert not plan.devices and not plan.binds and plan.env["CUDA_VISIBLE_DEVICES"] == "0"


def test_nvidia_runtime_detection():
    assert docker_gpu.has_nvidia_runtime({"Runtimes": {"runc": {}, "nvidia": {"path": "nvidia-container-runtime"}}})


# ---- the host base -----------------------------------------------------------------------------
def test_rootfs_keeps_links_and_what_they_point_at(tmp_path):
    (tmp_path / "usr" / "lib").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "libx.so.1.2").write_bytes(b"\x7fELF")
    (tmp_path / "usr" / "lib" / "libx.so.1").symlink_to("libx.so.1.2")
    (tmp_path / "lib").symlink_to("usr/lib")
    fs = docker_hostbase.RootFs()
    fs.add(str(tmp_path / "lib" / "libx.so.1"))
    entries = {os.path.relpath(p, tmp_path): kind for p, kind in fs.entries.items() if p.startswith(str(tmp_path))}
    assert entries == {".": "dir", "lib": "link", "usr": "dir", "usr/lib": "dir", "usr/lib/libx.so.1": "link",
                       "usr/lib/libx.so.1.2": "file"}


def test_rootfs_tar_opens_every_folder_to_the_worker(tmp_path):
    import tarfile

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "lib.so").write_bytes(b"x")
    (private / "lib.so").chmod(0o600)
    fs = docker_hostbase.RootFs()
    fs.add(str(private / "lib.so"))
    out = tmp_path / "rootfs.tar"
    fs.write_tar(str(out), {"/etc/passwd": (b"root:x:0:0::/:/bin/sh\n", 0o644), "/tmp": (None, 0o1777)})
    with tarfile.open(out) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members[str(private).lstrip("/")].mode & 0o755 == 0o755
    assert members[str(private / "lib.so").lstrip("/")].mode & 0o444 == 0o444
    assert members["tmp"].isdir() and members["tmp"].mode == 0o1777 and members["etc/passwd"].isfile()


def test_host_library_folders_never_include_the_checkout():
    root = str(docker_image.package_root())
    folders = docker_hostbase.host_library_folders(root)
    assert folders and not any(root == f or root.startswith(f + "/") for f in folders)
    assert not any(f in ("/", "/usr", "/usr/local") for f in folders)
    assert any(os.path.exists(os.path.join(f, "os.py")) or os.path.exists(os.path.join(f, "site-packages")) for f in folders)


def _fake_venv(root):
    (root / "bin").mkdir(parents=True)
    (root / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "bin" / "python3").symlink_to(sys.executable)
    return root


@pytest.mark.parametrize("inside_checkout", [False, True])
def test_a_venv_is_bound_whole(tmp_path, monkeypatch, inside_checkout):
    """A worker is started through the venv's bin/python3 (a link to the base interpreter) and
    needs its pyvenv.cfg: the whole venv is bound, not only its site-packages. Under /tmp (hidden
    by the container's private /tmp were it only in the image) and inside the checkout (.venv)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    venv = _fake_venv(repo / ".venv" if inside_checkout else tmp_path / "venv")
    monkeypatch.setattr(sys, "prefix", str(venv))
    folders = docker_hostbase.host_library_folders(str(repo))
    assert str(venv.resolve()) in folders
    assert not any(f == str(repo.resolve()) or str(repo.resolve()).startswith(f + "/") for f in folders)


def test_engine_failures_are_sandbox_errors():
    from docker.errors import APIError
    from requests.exceptions import ConnectionError as RequestsConnectionError

    for failure, words in [(APIError("500 Server Error", explanation="no space left on device"), "no space left"),
                           (RequestsConnectionError("Connection aborted."), "did not answer")]:
        with pytest.raises(SandboxError, match=words) as info:
            with docker_image.engine_errors("building the worker image x"):
                raise failure
        assert "building the worker image x" in str(info.value)


def test_an_image_whose_interpreter_is_missing_says_rebuild(monkeypatch):
    from docker.errors import APIError

    from kernforge.sandbox import docker_backend

    backend = object.__new__(docker_backend.DockerBackend)
    backend.plan = type("Plan", (), {"python": "/tmp/venv/bin/python3"})()
    backend.image = type("Info", (), {"tag": "kernforge-worker"})()
    backend.engine = None

    def refused(plan, engine):
        raise APIError("400 Client Error", explanation='failed to create shim task: OCI runtime create failed: exec: '
                                                       '"/tmp/venv/bin/python3": stat /tmp/venv/bin/python3: no such '
                                                       'file or directory: unknown')

    monkeypatch.setattr(docker_backend, "DockerWorker", refused)
    with pytest.raises(SandboxError, match="rebuild it with `kernforge sandbox build-image --from-host --force`"):
        backend._new_worker()


def test_image_holds_only_what_workers_import():
    files = docker_image.package_files()
    assert {"__init__.py", "sandbox/worker.py", "sandbox/docker_entry.py", "verifier/harness.py", "tasks/runtime.py",
            "sandbox/docker/Dockerfile"} <= set(files)
    assert not [f for f in files if f.startswith(("tasks/builtin/", "loop/", "archive/", "tests/")) or "__pycache__" in f]


def test_worker_package_binds_cover_the_builtin_tasks():
    overlay = docker_image.worker_package_binds()
    assert all(b.endswith(":ro") for b in overlay.binds)
    assert f"{docker_image.IMAGE_PACKAGE}/tasks/builtin" in overlay.hidden_dirs


# ---- owners --------------------------------------------------------------------------------------
def test_owner_names_a_live_process_and_not_a_dead_one():
    assert owner_alive(owner_id())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    owner = owner_id(child.pid)
    child.wait()
    assert not owner_alive(owner)
    assert not owner_alive("garbage") and not owner_alive(owner_id().replace(owner_id().split("/")[0], "other-boot"))


# ---- with an engine: the image build, the CLI, doctor -------------------------------------------
@pytest.mark.docker
def test_build_image_from_host_is_cached_and_reported():
    from kernforge.cli import app
    from kernforge.sandbox.docker_probe import probe_docker

    first = CliRunner().invoke(app, ["sandbox", "build-image", "--from-host"])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(app, ["sandbox", "build-image", "--from-host"])
    assert again.exit_code == 0, again.output
    assert "host base kernforge-hostbase:" in again.output and "kernforge-worker is up to date" in again.output
    assert first.output.strip().splitlines()[-1] == again.output.strip().splitlines()[-1]  # the same image
    ok, detail = probe_docker()
    assert ok and "current" in detail


def test_build_image_refuses_two_bases():
    with pytest.raises(SandboxError, match="not both"):
        docker_image.build_image(engine=object(), base="pytorch/pytorch:latest", from_host=True)


def test_driver_found_outside_the_loader_cache(tmp_path):
    for name in ("libcuda.so.580.159.04", "libcuda.so.1", "libnvidia-ml.so.1", "libcudart.so.13", "libGL.so.1"):
        (tmp_path / name).write_bytes(b"")
    assert docker_gpu.scan_driver_folders([str(tmp_path), str(tmp_path / "missing")]) == {
        "libcuda.so.1": str(tmp_path / "libcuda.so.1"), "libnvidia-ml.so.1": str(tmp_path / "libnvidia-ml.so.1")}


@pytest.mark.docker
@pytest.mark.slow
def test_an_image_built_from_a_venv_under_tmp_runs_its_workers(tmp_path):
    """`kernforge sandbox build-image --from-host` run by a venv's kernforge (here a venv under
    /tmp, whose packages come from this interpreter's through a .pth file), then `eval --sandbox
    docker` with that image: the worker starts (its bin/python3 is there) and judges the seed."""
    import sysconfig

    from kernforge.tasks.loader import load_task

    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python3"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    here = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (Path(site) / "_kernforge_parent.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in here))
    tag = f"kernforge-worker-venv-test:{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KERNFORGE_SANDBOX_IMAGE")}
    try:
        built = subprocess.run([str(python), "-m", "kernforge.cli", "sandbox", "build-image", "--from-host", "--tag", tag],
                               capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
        assert built.returncode == 0, built.stdout + built.stderr
        assert str(venv) in built.stderr  # the venv is bound whole
        candidate = tmp_path / "seed.py"
        candidate.write_text(load_task("rms_norm").seed_source)
        judged = subprocess.run([str(python), "-m", "kernforge.cli", "eval", str(candidate), "--task", "rms_norm",
                                 "--sandbox", "docker", "--json"], capture_output=True, text=True, timeout=900,
                                env=env | {"KERNFORGE_SANDBOX_IMAGE": tag}, cwd=tmp_path)
        assert judged.returncode == 0, judged.stdout + judged.stderr
        assert "Traceback" not in judged.stderr
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
