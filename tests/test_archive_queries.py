"""Archive queries: the score, best per task/GPU and per shape, population, lineage, stats, search."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import replace

import pytest

from kernforge.archive import synthetic
from kernforge.archive.errors import ArchiveError
from kernforge.archive.records import NewAttempt
from kernforge.archive.score import geomean, summarize
from kernforge.archive.store import Archive
from kernforge.verifier.verdict import Accepted, Rejected, ShapeResult, Status

H200, A100, CPU = synthetic.H200, synthetic.A100, synthetic.INTERPRETER


def timed(t, time_us, compile_us=20.0, eager_us=40.0, timing="graph", **kw) -> ShapeResult:
    return ShapeResult(shape={"T": t}, hidden=kw.pop("hidden", False), dtype="bfloat16", timing=timing,
                       time_us=time_us, compile_us=compile_us, eager_us=eager_us, **kw)


# ---- score ----------------------------------------------------------------------------------
def test_score_is_the_geomean_speedup_vs_compile_on_gpu_timed_shapes():
    shapes = [timed(1, 10, compile_us=20), timed(2, 10, compile_us=80),
              timed(3, 1, compile_us=1000, timing="interpreter"), timed(4, None)]
    s = summarize(shapes)
    assert s["score"] == pytest.approx(4.0)
    assert s["speedup_eager"] == pytest.approx(4.0)


@pytest.mark.parametrize("shapes", [
    [timed(1, 5, timing="interpreter")],                # interpreter numbers are never scored
    [timed(1, 5, compile_us=None)],                     # no torch.compile baseline: nothing to compare with
    [],
])
def test_no_score_without_gpu_timings_against_compile(shapes):
    assert summarize(shapes)["score"] is None


def test_eager_fallback_timings_are_scored_and_stated_speedups_win():
    s = summarize([timed(1, 10, compile_us=20, timing="eager", speedup_compile=3.0, floor_us=5.0)])
    assert s["score"] == pytest.approx(3.0) and s["pct_roofline"] == pytest.approx(50.0)


def test_geomean():
    assert geomean([2, 8, None]) == pytest.approx(4.0)
    assert geomean([None]) is None


# ---- a small hand-made archive --------------------------------------------------------------
@pytest.fixture
def filled(tmp_path):
    """rms_norm: on H200 scores 1.0 (id 1), 4.0 (id 2, child of 1), 2.5 (id 3); on A100 8.0 (id 4);
    an interpreter accept (5), a cheat (6), a compile error (7, child of 2); softmax: one accept (8)."""
    archive = Archive.create(tmp_path / "k.db")
    rms = archive.register_task(synthetic.task_record("rms_norm"))
    soft = archive.register_task(synthetic.task_record("softmax"))
    run = archive.start_run({})

    def add(seq, task, verdict, env=H200, parent=None, model="m1", **kw):
        return archive.record_attempt(NewAttempt(run, seq, task, f"k = {seq}", verdict, dict(env),
                                                 parent_id=parent, model=model, proposer="llm", **kw))

    def acc(*speedups, env=H200):  # compile at 100 us; the candidate at 100/s us; the floor a quarter of that
        shapes = (timed(2**i, 100 / s, compile_us=100, floor_us=25 / s) for i, s in enumerate(speedups))
        return Accepted(shapes=tuple(shapes), environment=dict(env))

    add(0, rms, acc(1.0, 1.0), tokens_in=100, cost_usd=1.0)
    add(1, rms, acc(2.0, 8.0), parent=1, model="m2", tokens_in=50)
    add(2, rms, acc(2.5), model="m2")
    add(3, rms, acc(8.0, env=A100), env=A100)
    add(4, rms, Accepted(shapes=(timed(1, 3, timing="interpreter"),), environment=dict(CPU)), env=CPU)
    add(5, rms, Rejected(Status.CHEAT, "timer patched", threat=8), model="m2", tokens_out=7)
    add(6, rms, Rejected(Status.COMPILE_ERROR, "syntax"), parent=2)
    add(7, soft, acc(1.5))
    for attempt in (1, 2, 3, 4, 8):  # every accepted GPU attempt passed its audit
        archive.record_audit(attempt, synthetic.audit(archive.get_attempt(attempt).verdict))
    yield archive, rms, soft
    archive.close()


def test_best_per_task_and_gpu(filled):
    archive, rms, soft = filled
    best = {(b.task, b.gpu): b for b in archive.best()}
    assert set(best) == {("rms_norm", "NVIDIA H200"), ("rms_norm", "NVIDIA A100-SXM4-80GB"), ("softmax", "NVIDIA H200")}
    top = best[("rms_norm", "NVIDIA H200")]
    assert (top.attempt_id, top.score, top.pct_roofline, len(top.shapes)) == (2, pytest.approx(4.0), 25.0, 2)
    assert top.speedup_eager == pytest.approx(math.sqrt(0.8 * 3.2))  # eager at 40 us
    assert best[("rms_norm", "NVIDIA A100-SXM4-80GB")].attempt_id == 4
    assert [b.attempt_id for b in archive.best(task="rms_norm", gpu="h200")] == [2]
    assert [b.attempt_id for b in archive.best(gpu="A100")] == [4]


def test_interpreter_verdicts_are_never_a_best(tmp_path):
    with Archive.create(tmp_path / "cpu.db") as archive:
        rms = archive.register_task(synthetic.task_record("rms_norm"))
        run = archive.start_run({})
        for seq, time_us in enumerate((900.0, 3.0, 0.5)):  # ever "faster" interpreter times
            archive.record_attempt(NewAttempt(run, seq, rms, f"k = {seq}", Accepted(
                shapes=(timed(1, time_us, timing="interpreter"),), environment=dict(CPU)), dict(CPU)))
        assert archive.best() == [] and archive.best_per_shape() == []
        assert archive.population(rms, "cpu").top == ()  # no rank: the loop takes CPU kernels from `recent`


@pytest.mark.parametrize("kw, message", [({"task": "nope"}, "no task named 'nope'"), ({"gpu": "B200"}, "no GPU matching")])
def test_best_filters_name_what_exists(filled, kw, message):
    with pytest.raises(ArchiveError, match=message):
        filled[0].best(**kw)


def test_best_per_shape_takes_the_fastest_of_any_attempt(filled):
    archive, *_ = filled
    rows = {(r.gpu, r.label): r for r in archive.best_per_shape("rms_norm")}
    assert set(rows) == {("NVIDIA H200", "T=1"), ("NVIDIA H200", "T=2"), ("NVIDIA A100-SXM4-80GB", "T=1")}
    # attempt 3 is fastest at T=1 although attempt 2 has the better score
    assert (rows[("NVIDIA H200", "T=1")].attempt_id, rows[("NVIDIA H200", "T=1")].time_us) == (3, 40.0)
    assert (rows[("NVIDIA H200", "T=2")].attempt_id, rows[("NVIDIA H200", "T=2")].time_us) == (2, 12.5)
    assert rows[("NVIDIA A100-SXM4-80GB", "T=1")].pct_roofline == 25.0


def test_population_sections(filled):
    archive, rms, _ = filled
    pop = archive.population(rms, "NVIDIA H200", top=1, diverse=1, recent=3, failures=3)
    assert [a.id for a in pop.top] == [2]
    assert [a.id for a in pop.diverse] == [3]
    assert [a.id for a in pop.recent] == [1]  # 2 and 3 already chosen
    assert [a.id for a in pop.failures] == [7]  # never the cheat
    assert pop.audited == ()  # the audited best is in the top already
    assert len({a.code_hash for a in pop.members}) == len(pop.members)
    cpu = archive.population(rms, "cpu")
    assert [a.id for a in cpu.recent] == [5] and cpu.top == ()


def test_a_rejection_after_a_hidden_shape_is_a_failure_to_repair_whatever_its_status(tmp_path):
    """As in the loop's population (search.Member.repairable): which way a candidate failed once
    it had seen a hidden shape decides nothing a prompt shows, so not whether it is repaired."""
    from kernforge.verifier.verdict import SAW_HIDDEN

    with Archive.create(tmp_path / "k.db") as archive:
        rms = archive.register_task(synthetic.task_record("rms_norm"))
        run = archive.start_run({})
        for seq, evidence in enumerate(({}, {SAW_HIDDEN: True})):
            archive.record_attempt(NewAttempt(run, seq, rms, f"k = {seq}", Rejected(
                Status.SANDBOX_VIOLATION, "a process left running", threat=21, evidence=evidence), dict(H200)))
        assert [a.id for a in archive.population(rms, "NVIDIA H200", failures=3).failures] == [2]


def test_population_diverse_spreads_over_ranks(tmp_path):
    archive = Archive.create(tmp_path / "k.db")
    task, run = archive.register_task(synthetic.task_record("t")), archive.start_run({})
    for seq in range(40):
        verdict = Accepted(shapes=(timed(1, 10, compile_us=10 + seq),), environment=dict(H200))
        archive.record_attempt(NewAttempt(run, seq, task, f"v = {seq}", verdict))
    pop = archive.population(task, "NVIDIA H200", top=4, diverse=4, recent=0, failures=0)
    assert [a.seq for a in pop.top] == [39, 38, 37, 36]
    assert [a.seq for a in pop.diverse] == [35, 26, 17, 8]
    archive.close()


def test_lineage_is_root_first(filled):
    archive, *_ = filled
    assert [a.id for a in archive.lineage(7)] == [1, 2, 7]
    assert [a.id for a in archive.lineage(3)] == [3]
    with pytest.raises(ArchiveError, match="no attempt 99"):
        archive.lineage(99)


def test_stats_per_task_and_model(filled):
    archive, *_ = filled
    stats = archive.stats()
    rms = {r.key: r for r in stats.per_task}["rms_norm"]
    assert (rms.attempts, rms.accepted, rms.cheats, rms.tokens_in, rms.cost_usd) == (7, 5, {8: 1}, 150, 1.0)
    assert rms.acceptance_rate == pytest.approx(5 / 7)
    assert rms.by_status == {"accepted": 5, "cheat": 1, "compile_error": 1}
    m2 = {r.key: r for r in stats.per_model}["m2"]
    assert (m2.attempts, m2.accepted, m2.tokens_out, m2.cheats) == (3, 2, 7, {8: 1})
    assert [r.key for r in archive.stats(task="softmax").per_task] == ["softmax"]


def test_search_code_and_reasons(filled):
    archive, *_ = filled
    assert [a.id for a in archive.search("timer patched")] == [6]
    assert {a.id for a in archive.search("k")} == set(range(1, 9))
    assert archive.search('"quoted OR weird') == []


def test_stats_match_the_attempts_after_many_random_writes(tmp_path):
    rng = random.Random(11)
    archive = Archive.create(tmp_path / "k.db")
    tasks = {name: archive.register_task(synthetic.task_record(name)) for name in synthetic.TASKS[:3]}
    run = archive.start_run({})
    items = []
    for seq in range(300):
        name = rng.choice(list(tasks))
        env = rng.choice(synthetic.ENVIRONMENTS)
        item = synthetic.attempt(rng, run, seq, tasks[name], name, seq, environment=env)
        earlier = [i for i in items if (i.task_id, i.environment) == (item.task_id, item.environment)]
        if earlier and rng.random() < 0.25:  # the same code proposed again: a reuse
            item = replace(item, code=rng.choice(earlier).code)
        items.append(item)
    for start in range(0, 300, 37):
        archive.record_attempts(items[start:start + 37])
    expected = Counter()
    for item in items:
        key = item.model or item.proposer
        expected[key, "attempts"] += 1
        expected[key, "tokens_in"] += item.tokens_in
    for row in archive.stats().per_model:
        assert (row.attempts, row.tokens_in) == (expected[row.key, "attempts"], expected[row.key, "tokens_in"])
    rows = archive.db.query("SELECT count(*) n, sum(accepted) acc, sum(reuse_of IS NOT NULL) reused FROM attempts")
    totals = next(rows)
    per_task = archive.stats().per_task
    assert sum(r.attempts for r in per_task) == totals["n"] == 300
    assert sum(r.accepted for r in per_task) == totals["acc"]
    assert sum(r.reused for r in per_task) == totals["reused"] > 0
    assert math.isclose(sum(r.cost_usd for r in per_task), sum(i.cost_usd for i in items))
    archive.close()


# ---- best means audited ---------------------------------------------------------------------
def test_best_takes_only_attempts_whose_latest_audit_passed(filled):
    archive, rms, _ = filled
    h200 = {"task": "rms_norm", "gpu": "H200"}
    faster = archive.record_attempt(NewAttempt(archive.start_run({}), 0, rms, "k = fast", Accepted(
        shapes=(timed(1, 1.0, compile_us=100), timed(2, 1.0, compile_us=100)), environment=dict(H200)), dict(H200)))
    assert [b.attempt_id for b in archive.best(**h200)] == [2]  # score 100, never audited: not a best
    assert {r.attempt_id for r in archive.best_per_shape(**h200)} == {2, 3}  # nor the fastest at any shape

    archive.record_audit(2, synthetic.audit(archive.get_attempt(2).verdict, ratio=1.6))  # demoted: its time did not hold
    best = archive.best(**h200)
    assert [b.attempt_id for b in best] == [3] and best[0].audit.passed and best[0].audit.attempt_id == 3
    assert {r.attempt_id for r in archive.best_per_shape(**h200)} == {1, 3}
    assert archive.get_attempt(2).audit_passed is False and archive.get_attempt(faster).audit_passed is None

    archive.record_audit(2, synthetic.audit(archive.get_attempt(2).verdict))  # audited again: the latest decides
    assert [b.attempt_id for b in archive.best(**h200)] == [2]
    archive.record_audit(faster, synthetic.audit(archive.get_attempt(faster).verdict))
    assert [b.attempt_id for b in archive.best(**h200)] == [faster]
    assert archive.awaiting_audit() == []


def test_awaiting_audit_names_tasks_with_accepted_gpu_attempts_and_no_best(tmp_path):
    with Archive.create(tmp_path / "k.db") as archive:
        rms = archive.register_task(synthetic.task_record("rms_norm"))
        run = archive.start_run({})
        ids = [archive.record_attempt(NewAttempt(run, seq, rms, f"k = {seq}", Accepted(
            shapes=(timed(1, 10.0 + seq),), environment=dict(H200)), dict(H200))) for seq in range(3)]
        archive.record_attempt(NewAttempt(run, 3, rms, "k = cpu", Accepted(
            shapes=(timed(1, 3, timing="interpreter"),), environment=dict(CPU)), dict(CPU)))
        archive.record_audit(ids[0], synthetic.audit(archive.get_attempt(ids[0]).verdict, ratio=2.0))
        assert archive.best() == [] and archive.best_per_shape() == []
        (waiting,) = archive.awaiting_audit()
        assert (waiting.task, waiting.gpu, waiting.accepted, waiting.audited, waiting.failed) == \
            ("rms_norm", "NVIDIA H200", 3, 1, 1)
        # what `kernforge archive audit` goes through: best first, the demoted left out
        assert [a.id for a in archive.audit_candidates(rms, "NVIDIA H200", 5)] == ids[1:]
        archive.record_audit(ids[2], synthetic.audit(archive.get_attempt(ids[2]).verdict))
        assert [(a.id, a.audit_passed) for a in archive.audit_candidates(rms, "NVIDIA H200", 5)] == \
            [(ids[1], None), (ids[2], True)]
        pop = archive.population(rms, "NVIDIA H200", top=1, diverse=0, recent=0, failures=0)
        assert [a.id for a in pop.top] == [ids[0]] and [a.id for a in pop.audited] == [ids[2]]  # the best, below the top
