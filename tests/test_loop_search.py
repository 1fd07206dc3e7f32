"""loop/search.py: niches, fitness, and parent selection that balances the best with exploration."""

from __future__ import annotations

import random
import sys
from collections import Counter
from pathlib import Path

import pytest

from kernforge.archive.records import AttemptRecord, Population as Archived
from kernforge.loop.search import MIN_GAIN, Member, Population, clears, fitness_of, niche_of, row_fitness
from kernforge.verifier.verdict import Accepted, Rejected, ShapeResult, Status, Verdict
from loop_helpers import history_row

sys.path.append(str(Path(__file__).resolve().parent))
from candidates import HONEST, RELU_KERNEL  # noqa: E402

LOOPED = HONEST.replace("    row = tl.program_id(0)\n", "    for row in range(tl.program_id(0), 1, 1):\n        pass\n    row = tl.program_id(0)\n")
TWO_KERNELS = HONEST + RELU_KERNEL.replace("import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n", "")
CUDA = 'import torch\nfrom torch.utils.cpp_extension import load_inline\nSRC = "__global__ void k(float* x) { for (int i = 0; i < 4; ++i) x[i] = 0; }"\nclass ModelNew(torch.nn.Module):\n    pass\n'


def accepted(*times_us: float, compile_us: float | None = 1000.0) -> Accepted:
    """Accepted with CUDA-graph times: scored (torch.compile at ``compile_us``) unless it is None."""
    shapes = tuple(ShapeResult({"T": i}, False, "float32", "graph", time_us=t, compile_us=compile_us)
                   for i, t in enumerate(times_us))
    return Accepted(shapes=shapes)


def interpreted(*times_us: float) -> Accepted:
    """Accepted on the CPU: the interpreter's wall clock, correctness only."""
    return Accepted(shapes=tuple(ShapeResult({"T": i}, False, "float32", "interpreter", time_us=t)
                                 for i, t in enumerate(times_us)))


def rejected(status: Status, threat: int | None = None) -> Rejected:
    return Rejected(status, f"{status.value} for a test", threat=threat)


def variant(n: int, code: str = HONEST) -> str:
    return code + f"\nVARIANT = {n}\n"  # a different module, same niche


@pytest.mark.parametrize("code, niche", [
    (HONEST, ("triton", "one kernel, flat")),
    (LOOPED, ("triton", "one kernel, looped")),
    (TWO_KERNELS, ("triton", "several kernels, flat")),
    (CUDA, ("cuda", "one kernel, looped")),
    ("import torch\nclass ModelNew(torch.nn.Module):\n    pass\n", ("other", "one kernel, flat")),
    ("def broken(:\n", ("unparsed", "-")),
])
def test_niches(code, niche):
    assert niche_of(code) == niche


def test_fitness_ranks_scores_above_gpu_times_above_acceptance():
    scored = fitness_of(accepted(50.0, compile_us=100.0))  # GPU timing against torch.compile: score 2.0
    fast, slow = fitness_of(accepted(10.0, 20.0, compile_us=None)), fitness_of(accepted(20.0, 40.0, compile_us=None))
    cpu = fitness_of(interpreted(10.0, 20.0))
    assert cpu < slow < fast < scored and scored == (2, pytest.approx(2.0))
    assert fitness_of(rejected(Status.INCORRECT)) is None and fitness_of(None) is None


def test_interpreter_times_never_rank():
    assert fitness_of(interpreted(1.0)) == fitness_of(interpreted(1e6)) == (0, 0.0)
    pop = Population(rng=random.Random(0))
    assert pop.add(Member(variant(1), interpreted(900.0), attempt_id=1)) is True  # the first accepted kernel
    for i, t in enumerate((10.0, 1.0, 0.01), start=2):  # ever "faster" interpreter times change nothing
        assert pop.add(Member(variant(i), interpreted(t), attempt_id=i)) is False
    assert pop.best.attempt_id == 1 and pop.elites[niche_of(HONEST)].attempt_id == 1
    assert [m.attempt_id for m in pop.accepted] == [1, 2, 3, 4]  # acceptance, then the order they came
    assert [m.attempt_id for m in pop.inspirations(None)] == [1]
    assert [m.attempt_id for m in pop.tunable()] == [1, 2, 3, 4]


def test_an_archived_row_has_the_fitness_of_its_verdict():
    for verdict, row in (
        (accepted(50.0, compile_us=100.0), history_row(1, status="accepted", accepted=True, score=2.0)),
        (accepted(10.0, 40.0, compile_us=None), history_row(2, status="accepted", accepted=True, time_us=20.0)),
        # history rows carry GPU times only: an interpreter row has none
        (interpreted(10.0, 40.0), history_row(3, status="accepted", accepted=True)),
        (rejected(Status.TIMEOUT), history_row(4, status="timeout")),
    ):
        expected, got = fitness_of(verdict), row_fitness(row)
        assert got is None if expected is None else got == pytest.approx(expected)
    assert row_fitness(history_row(5, status="accepted", accepted=True, score=2.0, reuse_of=1)) is None


def test_a_verdict_stays_typed_through_the_population():
    verdict = accepted(10.0)
    pop = Population(rng=random.Random(0))
    pop.add(Member(variant(1), verdict, attempt_id=1))
    failed = Rejected(Status.INCORRECT, "output 0 is wrong", evidence={"check": "values", "shape": {"T": 1}})
    pop.add(Member(variant(2), failed, attempt_id=2))
    assert pop.choose("improve").parent.verdict is verdict
    repair = pop.choose("repair").parent.verdict
    assert repair is failed and isinstance(repair, Rejected) and repair.check.value == "values"


def population(seed: int = 0) -> Population:
    pop = Population(rng=random.Random(seed))
    for i, t in enumerate((100.0, 50.0, 200.0, 80.0)):
        pop.add(Member(variant(i), accepted(t), attempt_id=i + 1, audit_passed=True))
    return pop


def test_best_and_elites_per_niche():
    pop = population()
    assert pop.best.attempt_id == 2
    assert pop.add(Member(LOOPED, accepted(400.0), attempt_id=10)) is False  # slower, but a niche of its own
    assert pop.elites[niche_of(LOOPED)].attempt_id == 10 and pop.elites[niche_of(HONEST)].attempt_id == 2
    assert pop.add(Member(variant(9), accepted(10.0), attempt_id=11, audit_passed=True)) is True  # the new best
    assert pop.best.attempt_id == 11


def test_improve_favours_the_best_but_not_always():
    pop = Population(rng=random.Random(1))
    for rank in range(8):  # attempt id = rank + 1; rank 0 is the fastest
        pop.add(Member(variant(rank), accepted(10.0 * (rank + 1)), attempt_id=rank + 1, audit_passed=True))
    picks = Counter(pop.choose("improve").parent.attempt_id for _ in range(800))
    assert picks[1] > 400  # the best half the time, plus the tournaments it wins
    assert picks[2] > picks[3] > picks[4] > 0  # tournaments of three reach beyond it, the faster more often
    assert picks[8] == 0  # the slowest never wins a tournament of three


def test_explore_draws_other_niches():
    pop = population()
    pop.add(Member(LOOPED, accepted(400.0), attempt_id=10))
    pop.add(Member(TWO_KERNELS, accepted(300.0), attempt_id=12))
    picks = Counter(pop.choose("explore").parent.attempt_id for _ in range(200))
    assert set(picks) == {10, 12}  # never the best's niche: kept diversity is used
    one_niche = population()
    assert {one_niche.choose("explore").parent.attempt_id for _ in range(100)} <= {1, 3, 4}


def test_repair_turns_newest_first_each_once_never_cheats():
    pop = Population(rng=random.Random(0))
    pop.add(Member(variant(1), rejected(Status.COMPILE_ERROR), attempt_id=1))
    pop.add(Member(variant(2), rejected(Status.CHEAT, threat=16), attempt_id=2))
    pop.add(Member(variant(3), rejected(Status.STATIC_REJECTED, threat=8), attempt_id=3))  # a cheat's signature
    pop.add(Member(variant(4), rejected(Status.SANDBOX_VIOLATION, threat=21), attempt_id=4))
    pop.add(Member(variant(5), rejected(Status.INCORRECT), attempt_id=5))
    assert [m.attempt_id for m in pop.failures] == [5, 1]
    assert pop.strategies() == ("repair", "fresh")
    assert [pop.choose("repair").parent.attempt_id for _ in range(2)] == [5, 1]
    assert pop.choose("repair").strategy == "fresh" and "repair" not in pop.strategies()


def test_a_rejection_after_a_hidden_shape_is_repaired_whatever_its_status():
    """Which way it failed there is the candidate's choice and no prompt tells the ways apart
    (prompts/feedback.py): whether it gets a repair turn must not either."""
    from kernforge.verifier.verdict import SAW_HIDDEN

    pop = Population(rng=random.Random(0))
    for i, status in enumerate((Status.CHEAT, Status.SANDBOX_VIOLATION, Status.INCORRECT), 1):
        pop.add(Member(variant(i), Rejected(status, "why", threat=21, evidence={SAW_HIDDEN: True}), attempt_id=i))
    assert [m.attempt_id for m in pop.failures] == [3, 2, 1]


def test_repair_chains_are_bounded():
    pop = Population(rng=random.Random(0), max_repairs=2)
    for depth in range(4):
        pop.add(Member(variant(depth), rejected(Status.RUNTIME_ERROR), attempt_id=depth, depth=depth))
    assert sorted(m.depth for m in pop.failures) == [0, 1]


def test_strategies_and_fallbacks():
    empty = Population(rng=random.Random(0))
    assert empty.strategies() == ("fresh",)
    choice = empty.choose("improve")
    assert choice.strategy == "fresh" and choice.parent is None
    empty.set_seed(HONEST)
    assert empty.strategies() == ("improve", "fresh")
    choice = empty.choose("improve")
    assert choice.parent.code == HONEST and choice.parent.verdict is None  # the unjudged seed
    empty.add(Member(HONEST, accepted(5.0), attempt_id=7, audit_passed=True))
    assert empty.seed is None and empty.best.attempt_id == 7
    with pytest.raises(ValueError):
        empty.choose("crossover")


def test_inspirations_are_other_kernels_fastest_first():
    pop = population()
    pop.add(Member(LOOPED, accepted(400.0), attempt_id=10))
    best = pop.best
    assert [m.attempt_id for m in pop.inspirations(best)] == [10]
    assert [m.attempt_id for m in pop.inspirations(None)] == [2, 10]
    assert [m.attempt_id for m in pop.tunable()][:2] == [2, 10]


def test_choices_are_reproducible_from_the_seed():
    pop_a, pop_b = population(3), population(3)
    a = [pop_a.choose("improve").parent.attempt_id for _ in range(20)]
    b = [pop_b.choose("improve").parent.attempt_id for _ in range(20)]
    assert a == b
    assert len(set(a)) > 1, a  # the draws vary, so the match is not a constant's


def test_load_from_the_archive_population():
    def record(i: int, verdict: Verdict, audit_passed: bool | None = None) -> AttemptRecord:
        return AttemptRecord(id=i, run_id=1, seq=i, task_id=1, task="t", code=variant(i), code_hash=str(i),
                             verdict=verdict, env_key="e", gpu="NVIDIA H200", created="", proposer="offline",
                             audit_passed=audit_passed)

    archived = Archived(top=(record(1, accepted(30.0), True),), recent=(record(2, accepted(60.0)),),
                        failures=(record(4, rejected(Status.INCORRECT)), record(3, rejected(Status.TIMEOUT))))
    pop = Population(rng=random.Random(0)).load_archived(archived)
    assert pop.best.attempt_id == 1 and [m.attempt_id for m in pop.accepted] == [1, 2]
    assert [m.attempt_id for m in pop.failures] == [4, 3]  # newest first, as the archive lists them
    assert pop.best.verdict is archived.top[0].verdict  # the record's own verdict, not a dict of it


def test_load_from_the_archive_keeps_the_audit_of_each_record():
    def record(i: int, time_us: float, audit_passed: bool | None) -> AttemptRecord:
        return AttemptRecord(id=i, run_id=1, seq=i, task_id=1, task="t", code=variant(i), code_hash=str(i),
                             verdict=accepted(time_us), env_key="e", gpu="NVIDIA H200", created="",
                             audit_passed=audit_passed)

    # the top by score holds a demoted and an unaudited kernel; the audited best comes below them
    archived = Archived(audited=(record(3, 50.0, True),), top=(record(1, 10.0, False), record(2, 20.0, None)))
    pop = Population(rng=random.Random(0)).load_archived(archived)
    assert pop.best.attempt_id == 3
    assert [m.attempt_id for m in pop.accepted] == [2, 3] and [m.attempt_id for m in pop.demoted] == [1]
    assert [m.attempt_id for m in pop.contenders()] == [2]  # fitter than the best, never audited


# ---- the audit of a would-be best -------------------------------------------------------------
def test_a_gpu_kernel_leads_only_once_its_audit_passed():
    pop = population()  # audited; the best is attempt 2 at 50 us
    faster = Member(variant(20), accepted(20.0), attempt_id=20)
    assert pop.needs_audit(faster)
    assert not pop.needs_audit(Member(variant(21), accepted(90.0), attempt_id=21))  # slower than the best
    assert not pop.needs_audit(Member(variant(22), interpreted(1.0), attempt_id=22))  # correctness only
    assert not pop.needs_audit(Member(variant(23), rejected(Status.INCORRECT), attempt_id=23))
    assert not pop.needs_audit(Member(variant(1), accepted(1.0), attempt_id=2))  # known code: judged before

    # never audited (a run stopped between its attempt and its audit): a parent, not the best
    assert pop.add(faster) is False and pop.best.attempt_id == 2
    assert faster in pop.accepted and pop.contenders() == [faster]
    assert not pop.needs_audit(Member(variant(24), accepted(30.0), attempt_id=24, audit_passed=True)) \
        and pop.add(Member(variant(24), accepted(30.0), attempt_id=24, audit_passed=True)) is True
    assert pop.best.attempt_id == 24


def test_a_near_tie_with_the_best_is_neither_audited_nor_a_contender():
    """Fitter than the best by less than the judge's noise (MIN_GAIN): an audit would buy a claim
    of a faster kernel that a second timing of the same kernel could reverse."""
    pop = population()  # the best: attempt 2, 50 us, scored against torch.compile at 1000 us
    near = 50.0 / (1 + MIN_GAIN / 2)  # half the margin faster
    clear = 50.0 / (1 + 2 * MIN_GAIN)
    tie = Member(variant(40), accepted(near), attempt_id=40)
    ahead = Member(variant(41), accepted(clear), attempt_id=41)
    assert tie.fitness > pop.best.fitness, "fitter by the tuple's order"
    assert not pop.needs_audit(tie) and pop.needs_audit(ahead)
    assert pop.add(tie) is False and pop.contenders() == [] and tie in pop.accepted  # still a parent
    assert pop.add(ahead) is False and pop.contenders() == [ahead]
    # audited anyway (say, by `kernforge archive audit`), a near-tie leads: the margin buys no audit, it takes no best away
    again = Population(rng=random.Random(0))
    again.add(Member(variant(2), accepted(50.0), attempt_id=2, audit_passed=True))
    assert again.add(Member(variant(40), accepted(near), attempt_id=40, audit_passed=True)) is True


def test_the_margin_holds_in_each_tier_of_fitness():
    scored, timed = (2, 1.0), (1, -4.0)  # a score, and the negated log of a GPU time
    assert clears((2, 1.0 * (1 + 2 * MIN_GAIN)), scored) and not clears((2, 1.0 * (1 + MIN_GAIN / 2)), scored)
    assert clears((1, -4.0 + 2 * MIN_GAIN), timed) and not clears((1, -4.0 + MIN_GAIN / 2), timed)
    assert clears(scored, timed) and not clears(timed, scored), "a higher tier leads whatever its value"
    assert not clears((0, 0.0), (0, 0.0)), "correctness only is never ranked"
    # a GPU-timed kernel without torch.compile's baseline: its time decides, by the same margin
    pop = Population(rng=random.Random(0))
    pop.add(Member(variant(1), accepted(50.0, compile_us=None), attempt_id=1, audit_passed=True))
    assert not pop.needs_audit(Member(variant(2), accepted(50.0 / (1 + MIN_GAIN / 2), compile_us=None), attempt_id=2))
    assert pop.needs_audit(Member(variant(3), accepted(50.0 / (1 + 2 * MIN_GAIN), compile_us=None), attempt_id=3))


def test_a_demoted_kernel_is_never_the_best_nor_chosen():
    pop = population()
    demoted = Member(LOOPED, accepted(1.0), attempt_id=30, audit_passed=False)  # fastest of all, audit failed
    assert not pop.needs_audit(demoted)
    assert pop.add(demoted) is False
    assert pop.best.attempt_id == 2 and pop.demoted == [demoted]  # the previous best remains
    assert demoted not in pop.accepted and niche_of(LOOPED) not in pop.elites
    chosen = {pop.choose(s).parent.attempt_id for s in ("improve", "explore") for _ in range(100)}
    assert 30 not in chosen
    assert 30 not in [m.attempt_id for m in (*pop.inspirations(None), *pop.tunable())]
    assert pop.add(Member(LOOPED, accepted(1.0), attempt_id=31, audit_passed=True)) is False  # its code is known


def test_interpreter_kernels_lead_without_an_audit():
    pop = Population(rng=random.Random(0))
    first = Member(variant(1), interpreted(900.0), attempt_id=1)
    assert not pop.needs_audit(first) and first.confirmed
    assert pop.add(first) is True and pop.best is first


def test_compile_times_are_the_judges_baselines_on_public_gpu_timed_shapes():
    """torch.compile's time per public shape for the prompt: the median over accepted kernels
    (demoted ones too: their baselines were measured all the same); never a hidden shape, an
    interpreter run or a rejection."""
    pop = Population(rng=random.Random(0))
    assert pop.compile_times() == ()
    public = lambda t, us, timing="graph": ShapeResult({"T": t}, False, "float32", timing, time_us=5.0, compile_us=us)
    hidden = ShapeResult({"T": 77}, True, "float32", "graph", time_us=5.0, compile_us=999.0)
    pop.add(Member(variant(1), Accepted(shapes=(public(1, 10.0), public(2, None), hidden)), attempt_id=1))
    pop.add(Member(variant(2), Accepted(shapes=(public(1, 30.0), public(2, 40.0))), attempt_id=2))
    pop.add(Member(variant(3), Accepted(shapes=(public(1, 11.0),)), attempt_id=3, audit_passed=False))
    pop.add(Member(variant(4), Accepted(shapes=(public(3, 7.0, "interpreter"),)), attempt_id=4))
    pop.add(Member(variant(5), Rejected(Status.INCORRECT, "wrong", shapes=(public(4, 8.0),)), attempt_id=5))
    assert dict(pop.compile_times()) == {"T=1": 11.0, "T=2": 40.0}


# ---- an audit made after the kernel was taken in (a stopped run left it unaudited) ----------------
def test_a_left_over_kernel_that_passes_its_audit_settles_as_the_best():
    pop = population()  # best: attempt 2, 50 us
    unaudited = Member(variant(7), accepted(20.0), attempt_id=7)
    assert pop.add(unaudited) is False and pop.contenders() == [unaudited] and pop.best.attempt_id == 2
    assert pop.elites[niche_of(HONEST)].attempt_id == 7, "an elite before its audit"
    assert pop.settle(Member(variant(7), accepted(20.0), attempt_id=7, audit_passed=True)) is True
    assert pop.best.attempt_id == 7 and pop.contenders() == []
    assert [m.attempt_id for m in pop.accepted].count(7) == 1


def test_a_left_over_kernel_that_fails_its_audit_is_demoted_and_its_niche_falls_back():
    pop = population()
    pop.add(Member(variant(7), accepted(20.0), attempt_id=7))
    assert pop.settle(Member(variant(7), accepted(20.0), attempt_id=7, audit_passed=False)) is False
    assert pop.best.attempt_id == 2 and pop.contenders() == []
    assert [m.attempt_id for m in pop.demoted] == [7] and 7 not in [m.attempt_id for m in pop.accepted]
    assert pop.elites[niche_of(HONEST)].attempt_id == 2, "the niche's next fittest is its elite again"


def test_settle_takes_only_an_audited_member_already_there():
    pop = population()
    with pytest.raises(ValueError):
        pop.settle(Member(variant(8), accepted(20.0), attempt_id=8, audit_passed=True))
    pop.add(Member(variant(8), accepted(20.0), attempt_id=8))
    with pytest.raises(ValueError):
        pop.settle(Member(variant(8), accepted(20.0), attempt_id=8))
