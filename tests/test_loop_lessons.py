"""loop/lessons.py: recurring failures become one-line rules; one-offs and acceptances do not."""

from __future__ import annotations

import pytest

from kernforge.loop.lessons import Failure, Lessons, classify
from kernforge.verifier.verdict import Rejected, Status
from loop_helpers import history_row


@pytest.mark.parametrize("failure, key, words", [
    (Failure("compile_error", None, "compiling failed while loading the module: NameError: name 'tl' is not defined",
             "compile", "Traceback ...\n  File \"candidate.py\", line 12\nNameError: name 'tl' is not defined"),
     ("compile_error", "NameError: name 'tl' is not defined"), "Compiling failed"),
    (Failure("runtime_error", None, "running failed while checking the public shape T=4 H=64, normal inputs: "
             "triton.runtime.errors.InterpreterError: AttributeError(\"module 'triton.language' has no attribute 'sqrtt'\")"),
     ("runtime_error", "triton.runtime.errors.InterpreterError: AttributeError(\"module 'triton.language' has no attribute 'sqrtt'\")"),
     "Running failed"),
    (Failure("cheat", 16, "forward ran torch compute ops ['aten::mul']"), ("threat", 16), "own kernels"),
    (Failure("static_rejected", 16, "line 9: `torch.rsqrt(x)` calls the torch compute op"), ("threat", 16), "THREATS #16"),
    (Failure("incorrect", 14, "output 0 is wrong (hidden shape T=3 H=200, normal inputs): ..."), ("threat", 14), "public shapes"),
    (Failure("incorrect", None, "output 0 is wrong (public shape T=4 H=64, large inputs): 3 of 256 elements"),
     ("incorrect", "large"), "float32"),
    (Failure("incorrect", None, "output 0 has the wrong dtype or shape", "output format"), ("incorrect", "format"), "dtype"),
    (Failure("static_rejected", None, "line 5: syntax error: expected ':' near `def f(x)`: the module must parse"),
     ("static", "syntax error: expected ':'"), "static screen"),
    (Failure("compile_error", None, "the reply held no candidate module (truncated): cut off", "extraction"),
     ("extraction", "truncated"), "output-token limit"),
    (Failure("compile_error", None, "the reply held no candidate module (no_model_new): 2 blocks", "extraction"),
     ("extraction", "no_code"), "defines ModelNew"),
    (Failure("timeout", None, "the candidate did not finish in time"), ("timeout",), "out of time"),
    (Failure("crashed", None, "the candidate's process crashed: SIGSEGV"), ("crashed",), "masks"),
])
def test_classes_and_rules(failure, key, words):
    found_key, text = classify(failure)
    assert found_key == key and words in text and "{n}" in text


def test_numbers_are_masked_so_the_same_error_counts_once():
    a = Failure("compile_error", None, "", "compile", "error at line 12: BLOCK 4096 exceeds 1024")
    b = Failure("compile_error", None, "", "compile", "error at line 40: BLOCK 8192 exceeds 1024")
    assert classify(a)[0] == classify(b)[0]


def test_acceptances_teach_nothing():
    assert classify(Failure("accepted", None, "fine")) is None


def test_only_recurring_failures_become_lessons_most_frequent_first():
    lessons = Lessons(min_count=2, max_lessons=2)
    cheat = Rejected(Status.CHEAT, "forward ran torch compute ops", threat=16).to_dict()
    timeout = Rejected(Status.TIMEOUT, "the candidate did not finish in time").to_dict()
    crash = Rejected(Status.CRASHED, "crashed").to_dict()
    for verdict in (timeout, cheat, cheat, timeout, cheat, crash):
        lessons.observe(Failure.of_verdict(verdict))
    assert lessons.current() == [
        "Caught cheating THREATS #16 reference call (3x): do the computation in your own kernels; torch compute ops "
        "in forward are rejected (allocation, views and reshapes are fine)",
        "Candidates ran out of time (2x): avoid huge compile-time unrolls (tl.static_range over large sizes) and "
        "loops that do not advance",
    ]  # the single crash is no lesson yet


def test_lessons_carry_across_runs_through_the_archive():
    cheat = {"status": "cheat", "reason": "torch ops", "threat": 16}
    rows = [history_row(1, **cheat), history_row(2, status="accepted", reason="ok", accepted=True),
            history_row(3, **cheat), history_row(4, **cheat, reuse_of=1)]
    lessons = Lessons()
    lessons.replay(rows)
    assert lessons.current() == [lessons.texts[("threat", 16)].replace("{n}", "2")]  # a reuse row is not a new failure


def test_error_text_with_braces_is_kept_verbatim():
    lessons = Lessons(min_count=1)
    lessons.observe(Failure("runtime_error", None, "", "runtime", "KeyError: {'a': 1}"))
    assert lessons.current() == ["Running failed (1x) with `KeyError: {'a': N}`: make sure the module cannot fail this way"]
