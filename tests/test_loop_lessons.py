"""loop/lessons.py: recurring failures become one-line rules; one-offs and acceptances do not.

Classes come from a rejection's typed fields, (status, threat, check) plus a typed sub-key, never
from its reason text; the rule a lesson states is the remedy of the defence that made the check.
"""

from __future__ import annotations

import pytest

from kernforge.loop.lessons import LOOP_RULES, Failure, Lessons, lesson_text
from kernforge.verifier import defences
from kernforge.verifier.checks import Check
from kernforge.verifier.defences import failures, static, values
from kernforge.verifier.screen import screen
from kernforge.verifier.verdict import Rejected, Status, verdict_from_dict
from loop_helpers import history_row

NAME_ERROR = "Traceback ...\n  File \"candidate.py\", line 12\nNameError: name 'tl' is not defined"


def compile_error(error: str = NAME_ERROR, what: str = "loading the module") -> Rejected:
    return Rejected(Status.COMPILE_ERROR, f"compiling failed while {what}: {error.splitlines()[-1]}",
                    check=Check.COMPILE, evidence={"error": error, "while": what})


def wrong(reason: str, threat: int | None = None, **evidence) -> Rejected:
    return values.DEFENCE.reject(Status.INCORRECT, reason, threat=threat, evidence={"output": 0, **evidence})


def cheat(reason: str = "forward ran torch compute ops ['aten::mul']") -> Rejected:
    return Rejected(Status.CHEAT, reason, threat=16, check=Check.TORCH_OPS, evidence={"torch_ops": ["aten::mul"]})


def extraction(kind: str) -> Rejected:
    # what the runner records for a reply without a module (loop/runner.py _unusable)
    return Rejected(Status.COMPILE_ERROR, f"the reply held no candidate module ({kind}): ...", check=Check.EXTRACTION,
                    evidence={"kind": kind})


def key_and_text(verdict: Rejected) -> tuple[tuple, str]:
    f = Failure.of_verdict(verdict)
    return f.key, lesson_text(f)


@pytest.mark.parametrize("verdict, detail, words", [
    (compile_error(), "NameError: name 'tl' is not defined", "Compiling failed with `NameError"),
    (failures.RUNTIME.reject(Status.RUNTIME_ERROR, "running failed while checking: AttributeError: sqrtt",
                             evidence={"error": "AttributeError: module 'triton.language' has no attribute 'sqrtt'"}),
     "AttributeError: module 'triton.language' has no attribute 'sqrtt'", "Running failed"),
    (failures.OOM.reject(Status.RUNTIME_ERROR, "ran out of memory", evidence={"error": "OutOfMemoryError: 80 GiB"}),
     "OutOfMemoryError: N GiB", "Ran out of memory"),
    (cheat(), "", "Caught cheating THREATS #16 reference call"),
    (static.findings(screen("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                            "        return torch.rsqrt(x)\n", allow_torch_ops=False)),
     "torch-compute", "The static screen rejected candidates for `torch-compute`"),
    (static.findings(screen("def f(:\n", allow_torch_ops=False)), "syntax", "for `syntax` (the module must parse"),
    (wrong("output 0 is wrong (hidden shape T=3 H=200, normal inputs): ...", threat=14), "",
     "Rejected with the signature of THREATS #14 shape fitting"),
    (wrong("output 0 is wrong (public shape T=4 H=64, large inputs): 3 of 256 elements"), "", "Wrong results ("),
    (wrong("output 0 is wrong: 3 of 256 elements", dist="large"), "large", "Wrong results on large inputs"),
    (Rejected(Status.INCORRECT, "output 0 has the wrong dtype or shape", check=Check.OUTPUT_FORMAT), "",
     "Outputs had the wrong dtype or shape"),
    (failures.SANDBOX.reject(Status.SANDBOX_VIOLATION, "exceeded its limits", threat=21), "",
     "Broke the sandbox's limits as THREATS #21"),
])
def test_classes_are_typed_keys_and_rules_are_the_defences_remedies(verdict, detail, words):
    key, text = key_and_text(verdict)
    assert key == (*verdict.key, detail)
    assert words in text and "{n}x" in text
    assert text.endswith(defences.remedy(verdict.check)) and defences.remedy(verdict.check)


@pytest.mark.parametrize("verdict, rule", [
    (extraction("truncated"), "truncated"),
    (extraction("no_model_new"), "no_code"),
    (extraction("no_code"), "no_code"),
    (failures.SANDBOX.reject(Status.TIMEOUT, "the candidate did not finish in time"), "timeout"),
    (failures.SANDBOX.reject(Status.CRASHED, "the candidate's process crashed: SIGSEGV"), "crashed"),
])
def test_the_loop_keeps_its_own_rules_for_its_own_check_timeouts_and_crashes(verdict, rule):
    key, text = key_and_text(verdict)
    assert key[:3] == verdict.key and text == LOOP_RULES[rule]


def test_the_same_check_with_other_reason_texts_is_one_lesson():
    lessons = Lessons(min_count=2)
    lessons.observe(Failure.of_verdict(cheat("forward ran torch compute ops ['aten::mul'] (public shape T=1 H=64)")))
    lessons.observe(Failure.of_verdict(cheat("forward ran torch compute ops ['aten::rsqrt', 'aten::mean']")))
    lessons.observe(Failure.of_verdict(wrong("output 0 is wrong (public shape T=4 H=64, normal inputs): 3 of 256")))
    lessons.observe(Failure.of_verdict(wrong("output 1 is wrong (public shape T=1 H=8, uniform inputs): 9 of 8")))
    assert len(lessons.counts) == 2 and set(lessons.counts.values()) == {2}
    assert len(lessons.current()) == 2


def test_different_checks_with_one_threat_are_kept_apart():
    # THREATS #17 (ghost kernel) is guarded by two defences: their remedies differ, so must the lessons
    ghost = Rejected(Status.CHEAT, "no kernel of its own ran", threat=17, check=Check.OWN_KERNELS)
    alias = Rejected(Status.CHEAT, "output 0 is input 0", threat=17, check=Check.ALIASING)
    lessons = Lessons(min_count=1)
    for verdict in (ghost, alias, ghost):
        lessons.observe(Failure.of_verdict(verdict))
    assert lessons.current() == [
        f"Caught cheating THREATS #17 ghost kernel (2x, own kernels check): {defences.remedy(Check.OWN_KERNELS)}",
        f"Caught cheating THREATS #17 ghost kernel (1x, aliasing check): {defences.remedy(Check.ALIASING)}",
    ]


def test_numbers_are_masked_so_the_same_error_counts_once():
    a = compile_error("error at line 12: BLOCK 4096 exceeds 1024")
    b = compile_error("error at line 40: BLOCK 8192 exceeds 1024", what="compiling the kernel")
    assert Failure.of_verdict(a).key == Failure.of_verdict(b).key
    assert Failure.of_verdict(a).key != Failure.of_verdict(compile_error()).key  # another error: another lesson


def test_only_recurring_failures_become_lessons_most_frequent_first():
    lessons = Lessons(min_count=2, max_lessons=2)
    timeout = failures.SANDBOX.reject(Status.TIMEOUT, "the candidate did not finish in time")
    crash = failures.SANDBOX.reject(Status.CRASHED, "crashed")
    for verdict in (timeout, cheat(), cheat(), timeout, cheat(), crash):
        lessons.observe(Failure.of_verdict(verdict))
    assert lessons.current() == [
        f"Caught cheating THREATS #16 reference call (3x, runtime trace check): {defences.remedy(Check.TORCH_OPS)}",
        LOOP_RULES["timeout"].replace("{n}", "2"),
    ]  # the single crash is no lesson yet


@pytest.mark.parametrize("verdict", [
    compile_error(), cheat(), extraction("truncated"), wrong("wrong", dist="heavy_tailed"),
    static.findings(screen("def f(:\n", allow_torch_ops=False)),
    failures.SANDBOX.reject(Status.TIMEOUT, "the candidate did not finish in time"),
])
def test_an_archived_row_lands_in_the_class_of_its_live_verdict(verdict, tmp_path):
    from kernforge.archive.history import task_history
    from kernforge.archive.records import NewAttempt
    from kernforge.archive.store import Archive
    from kernforge.archive import synthetic

    with Archive.create(tmp_path / "k.db") as archive:
        task_id = archive.register_task(synthetic.task_record("rms_norm"))
        run = archive.start_run({})
        archive.record_attempt(NewAttempt(run, 0, task_id, "k = 1", verdict, dict(synthetic.INTERPRETER)))
        (row,) = task_history(archive, task_id)
    assert Failure.of_row(row) == Failure.of_verdict(verdict)
    assert Failure.of_row(row).key == Failure.of_verdict(verdict_from_dict(verdict.to_dict())).key


def test_lessons_carry_across_runs_through_the_archive():
    cheat_row = {"status": "cheat", "reason": "torch ops", "threat": 16, "check": "runtime trace"}
    rows = [history_row(1, **cheat_row), history_row(2, status="accepted", reason="ok", accepted=True),
            history_row(3, **(cheat_row | {"reason": "other torch ops"})), history_row(4, **cheat_row, reuse_of=1)]
    lessons = Lessons()
    lessons.replay(rows)
    assert list(lessons.counts.items()) == [(("cheat", 16, "runtime trace", ""), 2)]  # a reuse row is not a new failure
    assert lessons.current() == [lessons.texts[("cheat", 16, "runtime trace", "")].replace("{n}", "2")]


def test_older_check_strings_are_read_by_check_parse():
    row = history_row(1, status="runtime_error", check="stage", evidence={"error": "ValueError: bad"})
    assert Failure.of_row(row).key == ("runtime_error", None, "runtime", "ValueError: bad")
    unknown = history_row(2, status="incorrect", check="something retired")
    assert Failure.of_row(unknown).check is Check.OTHER
    assert lesson_text(Failure.of_row(unknown)) == "Wrong results ({n}x, other check)"  # no defence: no rule invented


def test_error_text_with_braces_is_kept_verbatim():
    lessons = Lessons(min_count=1)
    lessons.observe(Failure.of_verdict(failures.RUNTIME.reject(Status.RUNTIME_ERROR, "running failed",
                                                                 evidence={"error": "KeyError: {'a': 1}"})))
    assert lessons.current() == [f"Running failed with `KeyError: {{'a': N}}` (1x, runtime check): "
                                 f"{defences.remedy(Check.RUNTIME)}"]


def test_an_error_raised_after_a_hidden_shape_is_never_quoted():
    """A candidate called at a hidden shape can spell it in its error as it likes (hex, numerals,
    words): a lesson quotes no error text of a rejection made after that, and two such errors with
    different texts are one lesson."""
    from kernforge.verifier.verdict import SAW_HIDDEN

    said = "RuntimeError: unsupported width 0x60 rows III (XCVI)"
    lessons = Lessons()
    for text in (said, "RuntimeError: something else entirely"):
        lessons.observe(Failure.of_verdict(Rejected(Status.RUNTIME_ERROR, f"running failed: {text}", check=Check.RUNTIME,
                                                    evidence={"error": text, SAW_HIDDEN: True})))
    (only,) = lessons.current()
    assert "0x60" not in only and "XCVI" not in only and "something" not in only and "(2x" in only
    public = Failure.of_verdict(Rejected(Status.RUNTIME_ERROR, "running failed", check=Check.RUNTIME,
                                         evidence={"error": "IndexError: out of range"}))
    assert "IndexError" in lesson_text(public)  # before any hidden shape, the error is the lesson


def test_every_way_of_failing_after_a_hidden_shape_is_one_lesson():
    """Wrong values, a crash, a time-out and a defence's check, each once the candidate had been
    called at a hidden shape: one class, whose lesson names none of them (which way it failed is
    the candidate's choice, and a lesson per way would spell bits of a hidden size)."""
    from kernforge.verifier.verdict import SAW_HIDDEN

    lessons = Lessons()
    for status, check, threat in ((Status.INCORRECT, Check.VALUES, None), (Status.CRASHED, Check.RUNTIME, None),
                                  (Status.TIMEOUT, Check.RUNTIME, None), (Status.CHEAT, Check.INPUT_MUTATION, 4)):
        lessons.observe(Failure.of_verdict(Rejected(status, "why", threat=threat, check=check,
                                                    evidence={"dist": "normal", SAW_HIDDEN: True})))
    assert lessons.current() == [LOOP_RULES["failed_at_hidden_shape"].replace("{n}", "4")]

