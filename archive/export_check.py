"""``kernforge export --check``: build the exported package, install it where it will be used, test it.

The wheel is built without build isolation (no registry needed) and installed, without its
dependencies, into a fresh virtual environment that sees this interpreter's packages: torch and
Triton come from here, whether they live in the system site-packages or in a virtual environment
of their own (a venv made from a venv sees only the base interpreter's packages, so a ``.pth``
file points it here). The package's tests then run there with ``kernforge`` made unimportable,
which shows the package needs nothing of kernforge at run time; on CUDA when this machine has a
GPU, else on the CPU, where no entry runs (every entry is GPU-verified) and the reference
fallbacks, opcheck and torch.compile are what is tested.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .export import ExportError


class PackageCheckFailed(ExportError):
    """A step of the check failed; the message holds the end of that step's output."""


class PackageCheckTimedOut(PackageCheckFailed):
    """A step of the check ran past its time and was killed."""


@dataclass(frozen=True)
class CheckResult:
    wheel: Path
    venv: Path
    #: JUnit XML of the package's test run
    report: Path
    output: str
    #: what the tests' command was kept from, in words
    confined: str = "run plainly"

    @property
    def summary(self) -> str:
        lines = [line for line in self.output.splitlines() if line.strip()]
        return lines[-1] if lines else ""


def _run(step: str, argv: list[str], *, timeout_s: float, **kwargs) -> subprocess.CompletedProcess:
    """One step of the check; its failure, or its running past ``timeout_s`` (the step is killed),
    is a ``PackageCheckFailed`` that ends with the step's output."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, **kwargs)
    except subprocess.TimeoutExpired as expired:
        # the output read before the kill; bytes on POSIX even with text=True
        parts = [p.decode(errors="replace") if isinstance(p, bytes) else p for p in (expired.stdout, expired.stderr) if p]
        raise PackageCheckTimedOut(f"{step} timed out after {timeout_s:g}s:\n{''.join(parts)[-6000:]}") from None
    if done.returncode != 0:
        raise PackageCheckFailed(f"{step} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-6000:]}")
    return done


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


#: how the tests' command is run over the package's kernels: ``(argv, workdir, shown, env)`` to the
#: command, its environment and a note of what it is kept from (sandbox/confine.py's, from the CLI)
Confine = Callable[[list[str], Path, Sequence[str], Mapping[str, str]], tuple[list[str], dict[str, str], str]]


def check_package(out: Path, work: Path, *, timeout_s: float = 1800, confine: Confine | None = None) -> CheckResult:
    """Build ``out`` into a wheel in ``out/dist``, install it into ``work/venv``, run its tests
    (each step within ``timeout_s``). The tests import every kernel of the package, code a model
    wrote: ``confine`` runs them without the user's secrets, network or home (without it, plainly:
    the tests' own use)."""
    out, work = Path(out).resolve(), Path(work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    dist = out / "dist"
    if importlib.util.find_spec("build") is not None:
        build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(out)]
    else:
        build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(out)]
    _run("building the wheel", build, timeout_s=timeout_s)
    wheels = sorted(dist.glob("*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise PackageCheckFailed(f"building the wheel left no .whl in {dist}")

    venv = work / "venv"
    _run("making the virtual environment",
         [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", "--clear", str(venv)],
         timeout_s=timeout_s)
    python = str(venv_python(venv))
    site = _run("reading the environment", [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                timeout_s=timeout_s)
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site.stdout.strip(), "_kernforge_check_parent.pth").write_text("\n".join(sorted(here)) + "\n")
    _run("installing the wheel", [python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheels[-1])],
         timeout_s=timeout_s)

    env: dict[str, str] = {}
    import torch

    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    report = work / "report.xml"
    name = next((out / "src").glob("*/manifest.json")).parent.name
    script = (
        f"import sys; sys.modules['kernforge'] = None; import pytest, {name}; "
        f"print('package at', {name}.__file__); "
        f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-rfEs', '--junitxml', {str(report)!r}, "
        f"{str(out / 'tests')!r}]))"
    )
    # run from the work folder: the export's src/ must not shadow the installed package
    argv, note = [python, "-c", script], "run plainly"
    if confine is not None:
        argv, full_env, note = confine(argv, work, [str(out)], env)
    else:
        full_env = {**os.environ, **env}
    done = _run("running the package's tests", argv, timeout_s=timeout_s, cwd=work, env=full_env)
    return CheckResult(wheel=wheels[-1], venv=venv, report=report, output=done.stdout + done.stderr, confined=note)


def check(out: Path, *, confine: Confine, timeout_s: float = 1800) -> str:
    """``check_package`` in a temporary folder; what to print. The folder is kept only when a step
    failed (to look into), and removed otherwise: passed, timed out (half-made) or an error of ours."""
    work = Path(tempfile.mkdtemp(prefix="kernforge-export-check-"))
    try:
        result = check_package(out, work, timeout_s=timeout_s, confine=confine)
    except PackageCheckTimedOut:
        shutil.rmtree(work, ignore_errors=True)
        raise
    except PackageCheckFailed as error:
        raise PackageCheckFailed(f"{error}\n(the virtual environment is kept in {work})") from None
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    shutil.rmtree(work, ignore_errors=True)
    import torch

    where = (f"on {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else
             "on the CPU (no GPU here: the entries' kernels are not run; the reference fallbacks, opcheck and "
             "torch.compile are tested)")
    return (f"checked: {result.wheel.name} installed into a fresh venv; its tests {where}, confined ({result.confined}): "
            f"{result.summary}")
