"""What a candidate's process must not hold: the hidden shapes of the task it is judged on
(THREATS #14). The worker rebuilds the task from its reference alone (tasks.loader.candidate_bundle),
and the sandbox hides the built-in tasks and the judged tasks' metadata files from it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from candidates import with_forward
from kernforge.loop.evaluate import open_judge
from kernforge.sandbox.isolation import mechanism
from kernforge.tasks.loader import BUILTIN_DIR, candidate_bundle, load_task, secret_paths
from kernforge.verifier.judge import JudgeOptions

TASKS = Path(__file__).parent / "tasks"

#: A kernel fitted to every shape it can find (the public ones it was shown, and whatever its own
#: process can read: the harness's task, metadata files of the tasks beside kernforge), and wrong
#: on any other: accepted if the hidden shapes leak into the candidate's process.
FITS_WHAT_IT_CAN_READ = with_forward('''        global KNOWN
        if KNOWN is None:
            KNOWN = {(4, 64), (8, 128)} | _readable_shapes()
        if tuple(x.shape) in KNOWN:
            return norm(x, w)
        y = torch.empty_like(x)  # elsewhere: a shortcut that is wrong (here, the wrong epsilon)
        _norm_kernel[(x.shape[0],)](x.contiguous(), w, y, x.shape[1], 1.0, BLOCK=triton.next_power_of_2(x.shape[1]))
        return y''', '''
import glob
import os
import re
import sys

KNOWN = None


def _readable_shapes():
    found = set()
    harness = sys.modules.get("kernforge.verifier.harness")
    task = harness._STATE.get("task") if harness is not None else None
    if task is not None:
        for s in task.public_shapes + task.hidden_shapes + task.cpu_public_shapes + task.cpu_hidden_shapes:
            d = dict(s.params)
            found.add((d.get("T"), d.get("H")))
    import kernforge
    root = os.path.dirname(kernforge.__file__)
    paths = glob.glob(os.path.join(root, "tests", "tasks", "**", "*.py"), recursive=True)
    paths += glob.glob(os.path.join(root, "tasks", "builtin", "**", "meta.py"), recursive=True)
    paths += glob.glob(os.path.join(os.getcwd(), "**", "*.py"), recursive=True)
    for path in paths:
        try:
            text = open(path).read()
        except OSError:
            continue
        found |= {(int(t), int(h)) for t, h in re.findall(r'"T":\\s*(\\d+),\\s*"H":\\s*(\\d+)', text)}
    return found
''')


def test_the_worker_gets_the_reference_and_nothing_of_the_metadata():
    task = load_task(TASKS / "tiny_norm")
    bundle = candidate_bundle(task)
    assert bundle["reference"] == task.reference_source
    assert bundle["meta"] is None  # tiny_norm mutates no input; its hidden shapes stay behind
    assert str(BUILTIN_DIR) in secret_paths([task]) and str(task.meta_path) in secret_paths([task])


def test_a_kernel_fitted_to_the_shapes_its_process_can_read_fails_the_hidden_ones(tmp_path):
    if not mechanism("strict").mountns:
        pytest.skip("this machine's sandbox cannot hide files (no bubblewrap, no mount namespace)")
    task = load_task(TASKS / "tiny_norm")
    options = JudgeOptions(cache_dir=tmp_path, static_screen=False)
    with open_judge("cpu", pool_size=1, options=options, tasks=[task]) as judge:
        verdict = judge.verify(FITS_WHAT_IT_CAN_READ, task)
    assert (verdict.status.value, verdict.threat) == ("incorrect", 14), verdict.reason
    assert verdict.evidence.get("hidden") is True


def test_the_judges_cache_is_hidden_from_candidates_and_compiles_for_trusted_workers(tmp_path, monkeypatch):
    """Baselines, ceilings and the reference worker's compiles live in the judge's cache folder:
    a candidate's worker never sees it (outside the home folder, KERNFORGE_CACHE_DIR, a worker of
    the same uid could otherwise rewrite a baseline or a kernel the reference worker runs); the
    reference worker keeps its Triton and Inductor caches in its private ``compiled/``."""
    from kernforge.loop import evaluate
    from kernforge.verifier.judge import JudgeOptions

    specs = {}

    class Recorder:
        def __init__(self, spec, *args, **kw):
            specs.setdefault("reference" if spec.isolation == "none" else "candidate", spec)

        def close(self):
            pass

    monkeypatch.setattr(evaluate, "make_backend", lambda kind, spec, size, **kw: Recorder(spec))
    monkeypatch.setattr(evaluate, "ProcessBackend", Recorder)
    cache = tmp_path / "kf-cache"
    with evaluate.open_judge("cpu", options=JudgeOptions(cache_dir=cache)):
        pass
    assert str(cache) in specs["candidate"].hidden_paths and specs["candidate"].trusted_cache is None
    assert specs["reference"].trusted_cache == str(cache / "compiled")
    assert (cache / "compiled").stat().st_mode & 0o077 == 0, "private to this user"


#: A kernel that is right only where its process can read ``TARGET`` (a file with bytes in it, or a
#: folder with entries): judged where that is a secret, it must come out incorrect; judged with a
#: target it may read (the control), accepted.
RIGHT_ONLY_IF_IT_SEES = with_forward('''        if SEES is None:
            SEES = [_sees(TARGET)]
        if SEES[0]:
            return norm(x, w)
        y = torch.empty_like(x)  # blind: the wrong epsilon
        _norm_kernel[(x.shape[0],)](x.contiguous(), w, y, x.shape[1], 1.0, BLOCK=triton.next_power_of_2(x.shape[1]))
        return y''', '''
import os

SEES = None
TARGET = {target!r}


def _sees(path):
    try:
        if os.path.isdir(path):
            return bool(os.listdir(path))
        with open(path, "rb") as f:
            return bool(f.read(64))
    except OSError:
        return False
''').replace("        if SEES is None:", "        global SEES\n        if SEES is None:")


@pytest.fixture
def scratch():
    """A folder a worker would see: inside this interpreter's prefix, which every worker is shown
    (/tmp and the home folder are private or hidden, and so is all of kernforge's checkout but its
    worker packages, so nothing there could show a leak); removed afterwards."""
    import shutil
    import sys
    import uuid

    folder = Path(sys.prefix) / f".kernforge-scratch-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_copies_of_secrets_outside_their_files_are_hidden_too(scratch):
    """Found by red-teaming: a hidden metadata file's bytecode in ``__pycache__`` beside it
    (written by any process that imported it), the archive (its stored reasons name hidden shapes;
    its WAL file holds the newest), the checkout's history and its docs (an example report's
    tables), were all readable by a candidate that the sandbox showed everything else. Each is a target of a kernel right only where it can
    read its target; a control target proves the probe would see."""
    import importlib.util
    import py_compile
    import shutil
    import sqlite3

    import kernforge
    from kernforge.archive.store import private_files
    from kernforge.sandbox.isolation import other_roots, python_paths

    if not mechanism("strict").mountns:
        pytest.skip("this machine's sandbox cannot hide files (no bubblewrap, no mount namespace)")
    folder = scratch / "tiny_norm"
    shutil.copytree(TASKS / "tiny_norm", folder)
    task = load_task(folder)
    pyc = Path(importlib.util.cache_from_source(str(task.meta_path)))
    py_compile.compile(str(task.meta_path), cfile=str(pyc), doraise=True)  # as another process's import would
    db = scratch / "runs" / "k.db"
    db.parent.mkdir()
    archive = sqlite3.connect(db)
    archive.execute("pragma journal_mode=wal")
    archive.execute("create table reasons (reason text)")
    archive.execute("insert into reasons values ('incorrect at hidden shape T=3 H=96')")
    archive.commit()  # the connection stays open: its WAL file is there while the judge works
    targets = {"control": str(folder / "reference.py"), "bytecode of the metadata": str(pyc),
               "the archive": str(db), "the archive's WAL": str(db) + "-wal", "the archive's folder": str(db.parent)}
    root = Path(kernforge.__file__).resolve().parent
    for name, part in (("the docs", root / "docs" / "example-report.html"), ("the prompts' code", root / "prompts")):
        if part.exists():  # run from a checkout: its docs quote hidden shapes of the built-in tasks
            targets[name] = str(part)
    other_copy = root.parent / f".kernforge-other-copy-{os.getpid()}"  # beside this checkout, as a clone would be
    if other_roots() and any(root.parent.is_relative_to(r) for r in other_roots()) and os.access(root.parent, os.W_OK):
        other_copy.mkdir()
        (other_copy / "meta.py").write_text("HIDDEN_SHAPES = [{'T': 3, 'H': 96}]\n")
        targets["another copy on the host"] = str(other_copy / "meta.py")
    git = [Path(p) / ".git" for p in python_paths() if (Path(p) / ".git").is_dir()]
    if git:  # kernforge runs from a checkout here (CI's clone): its history holds the built-in metadata
        targets["the checkout's history"] = str(git[0])
    assert all(Path(t).exists() for t in targets.values()), targets
    options = JudgeOptions(cache_dir=scratch / "cache", static_screen=False, private_paths=private_files(db))
    try:
        with open_judge("cpu", pool_size=1, options=options, tasks=[task]) as judge:
            verdicts = {name: judge.verify(RIGHT_ONLY_IF_IT_SEES.format(target=target), task)
                        for name, target in targets.items()}
    finally:
        archive.close()
        shutil.rmtree(other_copy, ignore_errors=True)
    assert verdicts.pop("control").accepted
    seen = {name: v.reason for name, v in verdicts.items() if v.status.value != "incorrect"}
    assert not seen, seen
