"""The audit's second verdict (verifier/audit.py) and what the judge times in it: a routine
verdict is timed at the public shapes; an audit's times the hidden ones too, unless the options
say never (a benchmark ranked at its public sizes). The audit compares like shapes and says the
speedup at the hidden ones beside the public one, without judging it."""

from __future__ import annotations

import pytest

from kernforge.tasks.loader import load_task
from kernforge.verifier import audit
from kernforge.verifier.judge import Judge, JudgeOptions, _Verdict
from kernforge.verifier.verdict import Accepted, ShapeResult


def shape(t: int, time_us: float, compile_us: float, hidden: bool = False) -> ShapeResult:
    return ShapeResult({"T": t, "H": 4096}, hidden, "bfloat16", "graph", time_us=time_us, compile_us=compile_us, eager_us=3 * compile_us)


class AuditJudge:
    """Gives ``again`` as the second verdict, and records whether it was asked for an audit's."""

    def __init__(self, again: Accepted):
        self.again, self.asked = again, []

    def verify(self, source, task, bar=None, audit=False):
        self.asked.append(audit)
        return self.again


def test_the_audit_compares_like_shapes_and_says_the_hidden_speedup():
    recorded = Accepted(shapes=(shape(1, 10.0, 20.0), shape(2, 20.0, 20.0)))
    again = Accepted(shapes=(shape(1, 10.5, 20.0), shape(2, 20.5, 20.0), shape(3, 50.0, 25.0, hidden=True)))
    judge = AuditJudge(again)
    result = audit.audit(judge, "k = 1", load_task("rms_norm"), recorded)
    assert judge.asked == [True]
    assert result.passed and result.details["shapes"] == 2, "the hidden shape is not compared with the public times"
    assert result.details["hidden_x_compile"] == pytest.approx(0.5) and result.details["hidden_shapes"] == 1
    assert result.details["public_x_compile"] == pytest.approx((20 / 10.5 * 20 / 20.5) ** 0.5)
    assert "at its 1 hidden shape 0.50x torch.compile (public 1.36x)" in result.reason


def test_a_hidden_shape_far_slower_than_the_public_ones_is_said_not_failed():
    """Tiny hidden shapes are launch-bound, where an honest two-kernel design trails compile: a
    gap alone is no evidence, so the audit passes and the figure is on record."""
    recorded = Accepted(shapes=(shape(1, 10.0, 20.0),))
    again = Accepted(shapes=(shape(1, 10.0, 20.0), shape(3, 100.0, 5.0, hidden=True)))
    result = audit.audit(AuditJudge(again), "k = 1", load_task("rms_norm"), recorded)
    assert result.passed and result.details["hidden_x_compile"] == pytest.approx(0.05)


class Sequence(AuditJudge):
    """Gives each of ``verdicts`` in turn."""

    def __init__(self, *verdicts):
        super().__init__(None)
        self.verdicts = list(verdicts)

    def verify(self, source, task, bar=None, audit=False):
        self.asked.append(audit)
        return self.verdicts.pop(0)


def test_a_time_that_did_not_hold_is_judged_once_more_and_that_verdict_decides():
    """One disturbed measurement demoted an honest best (H100, session 61: 3-4 times its time at
    the small shapes, windows spread 35-175%). A time that does not hold is judged once more in
    another fresh worker; that verdict decides, and the audit says both."""
    from kernforge.verifier.verdict import Rejected, Status

    recorded = Accepted(shapes=(shape(1, 10.0, 20.0), shape(2, 20.0, 20.0)))
    slow = Accepted(shapes=(shape(1, 17.0, 20.0), shape(2, 36.0, 20.0)))
    held = Accepted(shapes=(shape(1, 10.2, 20.0), shape(2, 20.4, 20.0)))
    judge = Sequence(slow, held)
    result = audit.audit(judge, "k = 1", load_task("rms_norm"), recorded)
    assert judge.asked == [True, True] and result.passed and result.verdict is held
    assert "judged a third time: the second verdict read 24.74 us (+74.9%)" in result.reason
    assert result.details["first_try"]["ratio"] == pytest.approx(1.749, abs=1e-3)

    judge = Sequence(slow, Accepted(shapes=(shape(1, 16.0, 20.0), shape(2, 35.0, 20.0))))
    result = audit.audit(judge, "k = 1", load_task("rms_norm"), recorded)
    assert not result.passed and result.only_slower and len(judge.asked) == 2
    assert result.reason.startswith("its time did not hold: 14.14 us recorded, 23.66 us judged again")

    cheat = Rejected(Status.CHEAT, "its outputs were written after the window closed", threat=14)
    result = audit.audit(Sequence(slow, cheat), "k = 1", load_task("rms_norm"), recorded)
    assert not result.passed and not result.only_slower and "it was rejected" in result.reason

    judge = Sequence(held)
    assert audit.audit(judge, "k = 1", load_task("rms_norm"), recorded).passed and judge.asked == [True], \
        "a time that held is judged once"
    wrong = Rejected(Status.INCORRECT, "max abs err 0.5")
    judge = Sequence(wrong)
    assert not audit.audit(judge, "k = 1", load_task("rms_norm"), recorded).passed and judge.asked == [True], \
        "a rejection is never judged again"


@pytest.mark.parametrize("option, routine, in_audit", [("audit", False, True), ("always", True, True), ("never", False, False)])
def test_which_verdicts_time_the_hidden_shapes_on_a_gpu(option, routine, in_audit):
    task = load_task("rms_norm")
    judge = Judge(None, None, JudgeOptions(device="cuda:0", time_hidden=option))
    public = len(task.shapes("cuda", hidden=False))
    for is_audit, timed in ((False, routine), (True, in_audit)):
        judge._state = _Verdict(audit=is_audit)
        shapes = judge._timed_shapes(task)
        assert [h for _, h in shapes].count(False) == public
        assert any(h for _, h in shapes) == timed


def test_an_unknown_hidden_timing_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="audit, always, never"):
        JudgeOptions(time_hidden="sometimes")


def test_an_audits_record_that_failed_with_the_kernels_compiled_ahead_is_made_again_without_them():
    """The files compiled ahead only save compiles: where the profiled worker given them made no
    Nsight Compute record, the record is made again without them, so that they never cost the
    audit its evidence."""
    from kernforge.verifier import ncu

    recorded = Accepted(shapes=(shape(1, 10.0, 20.0),))
    files = {"k/__grp__x.json": "e30="}

    class Profiled(AuditJudge):
        def __init__(self, again):
            super().__init__(again)
            self.profiles = []

        def verify(self, source, task, bar=None, audit=False, compiled=None):
            self.asked.append(compiled)
            return self.again

        def profile(self, source, task, compiled=None):
            self.profiles.append(compiled)
            if compiled:
                return ncu.Profile(False, "no Nsight Compute record: the profiled worker failed")
            return ncu.Profile(False, "no Nsight Compute record: not on a GPU")

    judge = Profiled(Accepted(shapes=(shape(1, 10.0, 20.0),)))
    result = audit.audit(judge, "k = 1", load_task("rms_norm"), recorded, compiled=files)
    assert judge.asked == [files] and judge.profiles == [files, None]
    assert result.passed and "not on a GPU" in result.reason, "the record made without the files is the one said"
    judge = Profiled(Accepted(shapes=(shape(1, 10.0, 20.0),)))
    audit.audit(judge, "k = 1", load_task("rms_norm"), recorded)
    assert judge.asked == [None] and judge.profiles == [None], "without files: one record, as before"
