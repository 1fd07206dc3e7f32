"""Every verdict checks hidden shapes drawn for it alone (tasks/draws.py), beside the task's fixed
ones: a candidate told the fixed ones by an earlier worker (session 36: through the page cache's
timing) and right only there is rejected, and a prompt learns nothing of the shape it failed at."""

from __future__ import annotations

import shutil
from pathlib import Path

import candidates as C
import pytest
from kernforge.loop.evaluate import open_judge
from kernforge.prompts.feedback import candidate_text_withheld
from kernforge.tasks.loader import load_task
from kernforge.verifier.judge import JudgeOptions

TASKS = Path(__file__).parent / "tasks"

DRAWER = '''

def draw_hidden_shape(rng, device):
    return {"T": rng.randint(1, 5), "H": rng.randint(16, 200)}
'''

#: every shape of the task, fixed hidden ones included, as a worker that read them elsewhere knows
#: them: right there, and wrong (an epsilon of a million) anywhere else
LEAKED = C.with_forward('''        if (x.shape[0], x.shape[1]) in {(4, 64), (8, 128), (3, 96), (5, 200)}:
            return norm(x, w)
        y = torch.empty_like(x)
        _norm_kernel[(x.shape[0],)](x.contiguous(), w, y, x.shape[1], 1e6, BLOCK=triton.next_power_of_2(x.shape[1]))
        return y''')


@pytest.fixture(scope="module")
def drawn_task(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tasks") / "drawn_norm"
    shutil.copytree(TASKS / "tiny_norm", folder)
    (folder / "meta.py").write_text((folder / "meta.py").read_text() + DRAWER)
    return load_task(folder)


@pytest.fixture(scope="module")
def judges(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    with open_judge("cpu", pool_size=1, options=JudgeOptions(cache_dir=cache)) as drawing, \
            open_judge("cpu", pool_size=1, options=JudgeOptions(cache_dir=cache, drawn_shapes=0)) as fixed:
        yield drawing, fixed


def test_a_candidate_right_only_at_the_leaked_shapes_fails_at_a_drawn_one(judges, drawn_task):
    drawing, fixed = judges
    assert fixed.verify(LEAKED, drawn_task).accepted, "with the fixed shapes alone it passes: the hole this closes"
    verdict = drawing.verify(LEAKED, drawn_task)
    assert verdict.status.value == "incorrect", verdict.reason
    assert verdict.evidence.get("hidden") and "hidden shape" in verdict.reason
    drawn = verdict.environment["drawn_shapes"]
    assert len(drawn) == 1 and drawn[0]["T"] == verdict.evidence["shape"]["T"]
    assert candidate_text_withheld(verdict), "a prompt says only that a hidden shape failed"


def test_an_honest_candidate_passes_the_drawn_shape_too_and_the_verdict_names_it(judges, drawn_task):
    drawing, _ = judges
    declared = {s.params for s in (*drawn_task.cpu_public_shapes, *drawn_task.cpu_hidden_shapes)}
    verdict = drawing.verify(C.HONEST, drawn_task)
    assert verdict.accepted, verdict.reason
    (shape,) = verdict.environment["drawn_shapes"]
    assert tuple(shape.items()) not in declared
    assert "drawn_shapes=1" in verdict.environment["judged_with"], "keyed: a verdict made without draws is not reused"


def test_the_drawn_shape_is_sent_after_the_public_ones_and_never_before(judges, drawn_task, monkeypatch):
    """Its call goes with the hidden ones, after every public check and time: a process that has
    seen it never produces a figure a prompt shows."""
    from kernforge.verifier.judge import Judge

    drawing, _ = judges
    shapes: list[tuple[int, int]] = []
    original = Judge._send

    def recording(self, session, msg):
        if msg.get("op") == "check":
            shapes.append((msg["shape"]["T"], msg["shape"]["H"]))
        return original(self, session, msg)

    monkeypatch.setattr(Judge, "_send", recording)
    verdict = drawing.verify(C.HONEST, drawn_task)
    assert verdict.accepted, verdict.reason
    drawn = tuple(verdict.environment["drawn_shapes"][0].values())
    public = {(4, 64), (8, 128)}
    assert shapes.count(drawn) == 1 and shapes[-1] == drawn
    assert all(s in public for s in shapes[: shapes.index((3, 96))]), "no hidden call before the public ones are done"


def test_a_drawn_shape_larger_than_every_declared_one_is_said_and_not_checked(judges, tmp_path):
    """The memory plan rests on the declared shapes: a drawer that strays past them is the task's
    slip. Its shape is named in the verdict's environment, never run, and the candidate is judged."""
    folder = tmp_path / "large_draw"
    shutil.copytree(TASKS / "tiny_norm", folder)
    (folder / "meta.py").write_text((folder / "meta.py").read_text()
                                    + '\n\ndef draw_hidden_shape(rng, device):\n    return {"T": 64, "H": rng.randint(300, 400)}\n')
    drawing, _ = judges
    verdict = drawing.verify(C.HONEST, load_task(folder))
    assert verdict.accepted, verdict.reason
    (large,) = verdict.environment["drawn_too_large"]
    assert large["T"] == 64 and "drawn_shapes" not in verdict.environment


def test_a_drawn_shape_the_reference_cannot_run_is_said_and_not_checked(judges, tmp_path):
    """A KernelBench batch of 1 can break a reference (a training-mode BatchNorm1d): the task's
    limit, not the candidate's, and the verdict stands on the rest."""
    folder = tmp_path / "picky"
    shutil.copytree(TASKS / "tiny_norm", folder)
    reference = (folder / "reference.py").read_text()
    (folder / "reference.py").write_text(reference.replace(
        "        xf = x.float()", "        if x.shape[0] == 7:\n            raise ValueError('no batch of 7')\n        xf = x.float()"))
    (folder / "meta.py").write_text((folder / "meta.py").read_text()
                                    + '\n\ndef draw_hidden_shape(rng, device):\n    return {"T": 7, "H": 64}\n')
    drawing, _ = judges
    verdict = drawing.verify(C.HONEST, load_task(folder))
    assert verdict.accepted, verdict.reason
    assert verdict.environment["drawn_unrunnable"] == [{"T": 7, "H": 64}] and "no batch of 7" in verdict.environment["drawn_unrunnable_why"]
