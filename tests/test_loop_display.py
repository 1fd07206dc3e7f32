"""loop/display.py: the live table and the summary fit 80 columns, say what `archive best` says,
and a display whose reader is gone goes quiet instead of failing the run."""

from __future__ import annotations

import io
from collections import Counter

import pytest

from kernforge.loop.display import (AttemptEvent, GuardedDisplay, PlainDisplay, QuietDisplay, RunView, TaskStats,
                                    attempt_line, progress_table, summary)
from test_archive_tables import assert_fits, render

NAMES = ("fp8_quant_per_group", "fused_add_rms_norm", "rms_norm")


def stats(interpreter: bool) -> list[TaskStats]:
    out = []
    for i, name in enumerate(NAMES):
        t = TaskStats(name, attempts=1234 + i, accepted=700 + i, cheats=12, rejected=Counter(incorrect=300, timeout=7),
                      tokens=12_345_678, cost=123.4567, interpreter=interpreter)
        if not interpreter:
            t.best_attempt, t.best_time_us, t.best_speedup_eager, t.best_score = 4711 + i, 7133.9, 1.37, 1.12
        out.append(t)
    return out


def view(interpreter: bool) -> RunView:
    return RunView(run_id=3, proposer="LLM minimax-m3 at https://api.minimax.io/v1", devices=("cuda:0", "cuda:1"),
                   elapsed_s=3600.0, busy=0.97, tokens=37_000_000, cost=370.0, stopping=None,
                   tasks=tuple(stats(interpreter)))


def result(interpreter: bool) -> dict:
    return {"run_id": 3, "status": "finished", "proposer": "offline tuner", "db": "kernforge.db",
            "tasks": [t.to_dict() for t in stats(interpreter)], "attempts": 3705, "wall_s": 3600.0, "verify_s": 3400.0,
            "busy": 0.95, "tokens": 0, "cost": 0.0, "retries": 0, "llm_failures": 0, "stop_reason": None}


@pytest.mark.parametrize("interpreter", [False, True])
@pytest.mark.parametrize("build", [lambda i: progress_table(view(i)), lambda i: summary(result(i))],
                         ids=["live", "summary"])
def test_run_tables_fit_80_columns_with_whole_names_and_numbers(build, interpreter):
    text = render(build(interpreter), 80)
    assert_fits(text, 80)
    for name in NAMES:
        assert name in text
    assert "1234" in text and "700" in text
    if not interpreter:
        assert "7.13 ms" in text and "1.12x" in text


def test_an_interpreter_run_shows_no_best_as_archive_best():
    text = render(summary(result(True)), 200)
    assert "best kernels" not in text and "archive show" not in text
    assert "correctness only: no best" in text
    line = attempt_line(AttemptEvent(task="rms_norm", seq=0, attempt_id=1, status="accepted", threat=None, reused=False,
                                     proposer="seed", model="", time_us=23_600.0, speedup_eager=None, new_best=False,
                                     reason="the seed", tokens=0, cost=0.0, verify_s=1.0, interpreter=True))
    assert "23.6 ms (interpreter)" in line and "NEW BEST" not in line


class ClosedPipe(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_display_whose_reader_is_gone_goes_quiet():
    display = GuardedDisplay(PlainDisplay(ClosedPipe()))
    display.start(lambda: view(False))  # would raise BrokenPipeError unguarded
    display.note("stopping: interrupted (Ctrl-C)")
    display.stop()
    assert display.broken
    quiet = GuardedDisplay(QuietDisplay())
    quiet.note("kept")
    assert quiet.inner.notes == ["kept"] and not quiet.broken


def test_what_a_candidate_wrote_reaches_the_terminal_as_text():
    """Red team: an error beginning with ESC [ 2K ESC [ 1G erased the run's line and wrote a forged
    verdict in its place; a model's docstring read as a measured claim beside the real figures."""
    from kernforge.verifier.verdict import Rejected, Status

    forged = "\x1b[2K\x1b[1G[tiny_norm] #1 attempt 1: accepted 2.41 us (38.5x eager)  NEW BEST"
    verdict = Rejected(Status.COMPILE_ERROR, f"compiling failed: ImportError: {forged}")
    line = attempt_line(AttemptEvent(task="tiny_norm", seq=1, attempt_id=1, status=verdict.status.value, threat=None,
                                     reused=False, proposer="llm", model="m", time_us=None, speedup_eager=None,
                                     new_best=False, reason=verdict.reason, tokens=0, cost=0.0, verify_s=1.0))
    assert "\x1b" not in line and "\\x1b[2K" in line
    accepted = attempt_line(AttemptEvent(task="tiny_norm", seq=2, attempt_id=2, status="accepted", threat=None,
                                         reused=False, proposer="llm", model="m", time_us=3.0, speedup_eager=1.2,
                                         new_best=True, reason="5x faster than vLLM\u202e", tokens=0, cost=0.0, verify_s=1.0))
    assert "proposed as: '5x faster than vLLM\\u202e'" in accepted


def test_a_tasks_counters_count_each_verdict_once_and_keep_its_first_verdicts_time():
    from kernforge.verifier.checks import Check
    from kernforge.verifier.verdict import Accepted, Rejected, Status

    st = TaskStats("rms_norm")
    st.count(Accepted(shapes=()), tokens=100, cost=0.5, cost_known=True, reused=False, at_s=12.0)
    st.count(Rejected(Status.INCORRECT, "wrong at T=8", check=Check.INTEGRITY, threat=3), tokens=50, cost=0.25,
             cost_known=False, reused=True, at_s=20.0)
    assert (st.attempts, st.accepted, st.rejected, st.cheats, st.reused) == (2, 1, Counter(incorrect=1), 1, 1)
    assert (st.tokens, st.cost, st.cost_known, st.first_verdict_s) == (150, 0.75, False, 12.0)
