"""sandbox/bytecode.py: the bytecode an install lacks, compiled beside its sources by trusted code
for every candidate worker to read (the worker-side reading and the refused plant are in
test_sandbox.py, under each isolation mechanism)."""

from __future__ import annotations

import os
import subprocess
import sys

from kernforge.sandbox import bytecode


def _site(tmp_path):
    """A site folder with a package and a single-file module, no bytecode anywhere."""
    site = tmp_path / "site"
    (site / "pkg" / "sub").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("A = 1\n")
    (site / "pkg" / "sub" / "__init__.py").write_text("")
    (site / "pkg" / "sub" / "deep.py").write_text("B = 2\n")
    (site / "single.py").write_text("C = 3\n")
    return site


def _compile(roots, exclude=()):
    subprocess.run(bytecode.command(roots, exclude, 1), check=True, timeout=120,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"})


def test_the_roots_of_sources_without_bytecode_are_found_then_compiled_beside_them(tmp_path):
    site = _site(tmp_path)
    sources = [site / "pkg" / "__init__.py", site / "pkg" / "sub" / "deep.py", site / "single.py"]
    roots = bytecode.missing_roots(sources, [site])
    assert roots == [site / "pkg", site / "single.py"]
    _compile(roots)
    assert all(bytecode.beside(s).exists() for s in sources)
    assert bytecode.missing_roots(sources, [site]) == []


def test_nothing_under_an_excluded_path_or_outside_the_search_path_is_compiled(tmp_path):
    """A task's hidden metadata compiled to bytecode would hold its hidden shapes where the
    candidates read: an excluded path is never a root, and compileall leaves it out of a root."""
    site = _site(tmp_path)
    secret = site / "pkg" / "sub" / "deep.py"
    sources = [site / "pkg" / "__init__.py", site / "single.py"]
    assert bytecode.missing_roots(sources + [secret], [site], exclude=[secret]) == [site / "single.py"]
    assert bytecode.missing_roots([tmp_path / "elsewhere.py"], [site]) == []
    _compile([site / "pkg"], exclude=[secret])
    assert bytecode.beside(site / "pkg" / "__init__.py").exists()
    assert not bytecode.beside(secret).exists()


def test_a_virtual_environment_inside_an_excluded_checkout_is_still_compiled(tmp_path):
    """uv's ``.venv`` inside a kernforge checkout: the checkout is excluded (its tasks' hidden
    shapes), the environment's packages in it are not kernforge's."""
    site = _site(tmp_path / "checkout" / ".venv")
    sources = [site / "pkg" / "__init__.py", site / "single.py"]
    roots = bytecode.missing_roots(sources, [site], exclude=[tmp_path / "checkout"])
    assert roots == [site / "pkg", site / "single.py"]
    _compile(roots, exclude=[tmp_path / "checkout"])
    assert all(bytecode.beside(s).exists() for s in sources)


def test_compile_missing_compiles_the_imported_packages_never_kernforge_nor_an_excluded_path(tmp_path, monkeypatch):
    """The real entry: the packages this process imported (PACKAGES) whose bytecode is missing;
    ``pkg`` stands for the kernforge package here (whose bytecode is on this machine already)."""
    site = _site(tmp_path)
    (site / "other.py").write_text("D = 4\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # an install without bytecode: the import writes none
    monkeypatch.setattr(bytecode, "PACKAGES", ("pkg", "single", "other"))
    monkeypatch.setattr(bytecode, "KERNFORGE_ROOT", site / "pkg")
    for name in ("pkg", "pkg.sub", "pkg.sub.deep", "single", "other"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    for name in ("pkg.sub.deep", "single", "other"):
        __import__(name)
    assert not bytecode.beside(site / "single.py").exists()
    assert bytecode.compile_missing([site / "other.py"], processes=1) == [site / "single.py"]
    assert bytecode.beside(site / "single.py").exists()
    assert not list((site / "pkg").rglob("*.pyc")) and not bytecode.beside(site / "other.py").exists()
    assert bytecode.compile_missing([site / "other.py"], processes=1) == []


def test_doctor_says_whether_workers_compile_from_source_and_what_a_judge_does(tmp_path, monkeypatch):
    site = _site(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(bytecode, "PACKAGES", ("single",))
    monkeypatch.delitem(sys.modules, "single", raising=False)
    __import__("single")
    with monkeypatch.context() as m:
        m.setattr(bytecode.os, "access", lambda *args, **kwargs: False)  # an install the judge's user may not write
        ok, detail = bytecode.describe()
        assert not ok and "compiles them from source at its start" in detail and "--compile-bytecode" in detail
    ok, detail = bytecode.describe()
    assert ok and "1 of the 1 modules of single" in detail and str(site / "single.py") in detail
    bytecode.compile_missing(processes=1)
    assert bytecode.describe() == (True, "present beside all 1 modules of single a worker imports")
