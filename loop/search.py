"""The population of one task and how parents are chosen from it.

**Niches (MAP-Elites).** Every kernel falls into a niche by what kind of kernel it is, read from its
code without running it: the backend (Triton, CUDA C++ through ``load_inline``/NVRTC, or other)
and the structure of its kernels (one kernel or several; straight-line tiles or loops inside the
kernel, e.g. a row looped in chunks or a persistent grid). Each niche keeps its *elite*, the
fastest accepted kernel in it. A kernel never has to beat kernels of another kind to survive, so a
different approach that is slower today stays available to be improved tomorrow instead of being
crowded out by the current best.

**Fitness** (higher is better) ranks accepted kernels of one task in one environment, in three
tiers: the archive's score (geometric-mean speedup over ``torch.compile``, GPU timings) when there
is one; else the negated log of the geometric-mean GPU time (a GPU run whose ``torch.compile``
baseline was unavailable); else nothing but acceptance. Interpreter (CPU) verdicts are
correctness only: their times never rank, so every accepted interpreter kernel has the same
fitness and, as ties never displace, the first accepted kernel of a run stays the best and each
niche keeps its first elite (a new run starts from the archive's newest accepted kernels, which
the archive lists first when it has no score to rank by); parents are then drawn by the
strategies below among equals, and the offline tuner walks its own seeded order.

**Strategies**, chosen per proposal by the bandit (strategy.py):

* ``improve``: a fast parent: the best kernel half of the time, else the winner of a tournament
  of three drawn from the accepted kernels kept (strong, not always the same);
* ``explore``: the elite of another niche than the best's (uniformly), else any kept kernel but
  the best: the diversity MAP-Elites keeps is used, not only stored;
* ``repair``: the newest failure worth repairing (compile, runtime, correctness, timeout, crash,
  static screen without a cheat signature), each repaired once, and no chain of more than
  ``max_repairs`` repairs in a row; cheats are never evolved from;
* ``fresh``: no parent: a new kernel from the reference, the best kernels shown as inspirations.

Inspirations for a parent are the best kernel and the elites of the other niches, fastest first.
A new run starts from the archive (``Population.load_archived``): its best, a spread of ranks below, the
newest accepted kernels and failures, so it continues from where the last run stopped.

**The best is audited.** A kernel accepted with GPU times becomes the best only once its audit
passed (verifier/audit.py: judged again in a fresh worker on fresh inputs, its time confirmed).
The runner asks ``needs_audit`` before adding a kernel that would lead, audits it, and adds it
with the outcome. A kernel would lead only where it is fitter than the best by more than the
judge's own noise (``MIN_GAIN``, ``clears``): an audit costs three to five verdicts, and the same
kernel timed twice differs by a percent or two, so a near-tie's "gain" is a draw of that noise
(most of the would-be bests of the H100 runs were), neither worth an audit nor a claim a person
should read as a faster kernel. A near-tie stays an accepted kernel and a parent. A kernel
whose audit failed is *demoted*: it stays an accepted attempt in the archive but is never the best, an elite, an inspiration or a parent here. A kernel never audited
(from the archive: a run stopped between its attempt and its audit, or an older archive) is an
ordinary parent but never the best. Interpreter verdicts are never audited: correctness only,
they may be a CPU run's best as before.
"""

from __future__ import annotations

import ast
import math
import random
import re
import statistics
from dataclasses import dataclass, field

from kernforge.archive.history import HistoryRow
from kernforge.archive.queries import REPAIRABLE
from kernforge.archive.records import AttemptRecord, Population as ArchivedPopulation
from kernforge.archive.score import MIN_GAIN, geomean, partly_timed, ranked, summarize
from kernforge.verifier.audit import auditable
from kernforge.verifier.verdict import Status, Verdict, saw_hidden

STRATEGIES = ("improve", "explore", "repair", "fresh")
#: (tier, value), compared as a tuple: tier 2 the archive's score, tier 1 the negated log of the
#: GPU time where there is no score, tier 0 accepted with no GPU time (the interpreter), value 0
Fitness = tuple[int, float]
SCORED, GPU_TIMED, CORRECT_ONLY = 2, 1, 0
Niche = tuple[str, str]

_CUDA = re.compile(r"load_inline|nvrtc|cupy|__global__")
#: the repairable statuses, typed (the archive keeps them as strings for its SQL)
_REPAIRABLE = frozenset(Status(s) for s in REPAIRABLE)


def clears(fitness: Fitness, best: Fitness, gain: float = MIN_GAIN) -> bool:
    """Whether ``fitness`` is fitter than ``best`` by more than ``gain``: a higher tier always; in
    the score's tier by the score's ratio, in the GPU time's by its time's (the value is the
    negated log); correctness only never (those are never timed, so never ranked)."""
    if fitness[0] != best[0]:
        return fitness[0] > best[0]
    if fitness[0] == SCORED:
        return fitness[1] > best[1] * (1.0 + gain)
    if fitness[0] == GPU_TIMED:
        return fitness[1] > best[1] + math.log1p(gain)
    return False


def geomean_us(verdict: Verdict | None) -> float | None:
    """Geometric-mean time of a verdict's public shapes, any timing (the interpreter's too): for
    the display only, which labels interpreter times as such; nothing ranks by it. None when some
    shapes were not timed (``partly_timed``): a mean over some shapes would mislead beside others."""
    if verdict is None or partly_timed(verdict.shapes):
        return None
    return geomean(s.time_us for s in verdict.shapes if not s.hidden)


def gpu_geomean_us(verdict: Verdict | None) -> float | None:
    """Geometric-mean device time of a verdict's ranked shapes (public, graph or eager); None
    without any, or when some shapes were not timed (``partly_timed``: not comparable)."""
    if verdict is None or partly_timed(verdict.shapes):
        return None
    return geomean(s.time_us for s in verdict.shapes if ranked(s))


def speedups(verdict: Verdict | None) -> dict[str, float | None]:
    """The archive's aggregates of a verdict (``archive.score.summarize``): ``score`` (vs
    ``torch.compile``) and ``speedup_eager``, both over GPU-timed shapes only."""
    return summarize(verdict.shapes if verdict is not None else ())


def _fitness(accepted: bool, score: float | None, gpu_us: float | None) -> Fitness | None:
    """The one rule behind ``fitness_of`` and ``row_fitness``, so live and replayed agree."""
    if not accepted:
        return None
    if score is not None:
        return (SCORED, float(score))
    if gpu_us:
        return (GPU_TIMED, -math.log(gpu_us))
    return (CORRECT_ONLY, 0.0)


def fitness_of(verdict: Verdict | None) -> Fitness | None:
    """How good an accepted verdict is; None when rejected or unjudged."""
    if verdict is None:
        return None
    return _fitness(verdict.accepted, speedups(verdict)["score"], gpu_geomean_us(verdict))


def row_fitness(row: HistoryRow) -> Fitness | None:
    """``fitness_of`` for an archived row (``archive.history``; its ``time_us`` counts GPU timings
    only). A reuse row has none of its own: its original carries it, as in the archive's ranking."""
    if row.reuse_of is not None:
        return None
    return _fitness(row.accepted, row.score, row.time_us)


def niche_of(code: str) -> Niche:
    """(backend, structure) of a candidate module, read from its text and AST."""
    if _CUDA.search(code):
        kernels = code.count("__global__")
        looped = bool(re.search(r"\b(for|while)\s*\(", code))
        backend = "cuda"
    else:
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError, RecursionError):
            return ("unparsed", "-")
        jitted = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                  and any("jit" in ast.unparse(d) for d in n.decorator_list)]
        kernels = len(jitted)
        looped = any(isinstance(n, (ast.For, ast.While)) for k in jitted for n in ast.walk(k))
        backend = "triton" if jitted else "other"
    return backend, f"{'one kernel' if kernels <= 1 else 'several kernels'}, {'looped' if looped else 'flat'}"


@dataclass(frozen=True)
class Member:
    """A kernel the search knows: archived (``attempt_id``) or the task's seed before it is judged."""

    code: str
    verdict: Verdict | None
    attempt_id: int | None = None
    proposer: str = ""
    summary: str = ""
    #: repairs in a row that led to this kernel (a repair's child of a repair's child ...)
    depth: int = 0
    #: its latest audit passed (True), failed (False: demoted), or it was never audited (None)
    audit_passed: bool | None = None
    niche: Niche = field(init=False)
    fitness: Fitness | None = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "niche", niche_of(self.code))
        object.__setattr__(self, "fitness", fitness_of(self.verdict))

    @property
    def accepted(self) -> bool:
        return self.verdict is not None and self.verdict.accepted

    @property
    def auditable(self) -> bool:
        """Accepted with GPU times: it can lead only after an audit."""
        return self.verdict is not None and auditable(self.verdict)

    @property
    def demoted(self) -> bool:
        """Its latest audit failed: never the best (nor an elite, inspiration or parent)."""
        return self.audit_passed is False

    @property
    def confirmed(self) -> bool:
        """It may be the best: accepted, and audited with success unless it is an interpreter verdict."""
        if self.fitness is None:
            return False
        return self.audit_passed is True or (self.audit_passed is None and not self.auditable)

    @property
    def repairable(self) -> bool:
        """A rejection worth a repair turn: never a cheat, a sandbox violation or a cheat's signature,
        unless it was made after a hidden shape, where it always is: a prompt (and so whether one
        repairs it) never tells apart how the candidate failed there (prompts/feedback.py)."""
        v = self.verdict
        if v is not None and not v.accepted and saw_hidden(v.evidence):
            return True
        if v is None or v.accepted or v.status not in _REPAIRABLE:
            return False
        return not (v.status is Status.STATIC_REJECTED and v.threat)

    @classmethod
    def from_record(cls, record: AttemptRecord, depth: int = 0) -> "Member":
        return cls(record.code, record.verdict, record.id, record.proposer, depth=depth,
                   audit_passed=record.audit_passed)


@dataclass(frozen=True)
class Choice:
    strategy: str
    parent: Member | None
    inspirations: tuple[Member, ...] = ()


class Population:
    """The search state of one task: accepted kernels, niche elites, failures awaiting repair."""

    def __init__(self, *, rng: random.Random, keep: int = 32, max_repairs: int = 2, max_failures: int = 8) -> None:
        self.rng = rng
        self.keep = keep
        self.max_repairs = max_repairs
        self.max_failures = max_failures
        self.accepted: list[Member] = []  # fittest first, at most ``keep`` (elites and the best are kept besides)
        self.elites: dict[Niche, Member] = {}
        self.demoted: list[Member] = []  # failed their audit, newest first: known, never chosen
        self._best: Member | None = None
        self.failures: list[Member] = []  # newest first
        self.seed: Member | None = None  # the task's seed while it is not judged
        self.seed_failure: Member | None = None  # the seed, if it was rejected
        self._codes: set[str] = set()

    # ---- filling ------------------------------------------------------------------------------
    def load_archived(self, archived: ArchivedPopulation) -> "Population":
        """Take in the archive's population of the task: the top by score, its audited best, a spread
        of ranks below, the newest accepted kernels and the newest failures worth repairing."""
        records = (*archived.top, *archived.audited, *archived.diverse, *archived.recent, *reversed(archived.failures))
        for record in records:
            self.add(Member.from_record(record))
        return self

    @property
    def best(self) -> Member | None:
        """The fittest confirmed kernel (audited, or an interpreter verdict); the first on ties."""
        return self._best

    def needs_audit(self, member: Member) -> bool:
        """True when ``member`` would be the new best but needs an audit first: accepted with GPU
        times, not audited yet, new here, and fitter than the best by more than ``MIN_GAIN``."""
        if member.fitness is None or not member.auditable or member.audit_passed is not None:
            return False
        if member.code in self._codes:
            return False
        return self._leads(member)

    def contenders(self) -> list[Member]:
        """Kept kernels that would lead (fitter than the best by more than ``MIN_GAIN``) but cannot
        without an audit (never audited)."""
        return [m for m in self.accepted if not m.confirmed and self._leads(m)]

    def near_tie(self, member: Member) -> bool:
        """Fitter than the best, but not by ``MIN_GAIN``: within the judge's noise of it, so
        neither audited nor the best (a parent like any accepted kernel)."""
        best = self._best
        return (best is not None and member.fitness is not None and member.auditable and member.audit_passed is None
                and member.fitness > best.fitness and not clears(member.fitness, best.fitness))

    def _leads(self, member: Member) -> bool:
        assert member.fitness is not None
        return self._best is None or clears(member.fitness, self._best.fitness)

    def add(self, member: Member) -> bool:
        """Take a judged kernel in; True when it is the task's new best (only a confirmed kernel can
        be: see ``needs_audit``). A demoted kernel is kept aside, never chosen."""
        if self.seed is not None and self.seed.code == member.code:
            self.seed = None  # judged: from now on a member like any other
            if member.fitness is None:
                self.seed_failure = member
        if member.fitness is None:
            if member.repairable and member.depth < self.max_repairs and member.code not in self._codes:
                self.failures.insert(0, member)
                del self.failures[self.max_failures:]
            self._codes.add(member.code)
            return False
        if member.code in self._codes and any(m.code == member.code for m in (*self.accepted, *self.demoted)):
            return False
        self._codes.add(member.code)
        if member.demoted:
            self.demoted.insert(0, member)
            del self.demoted[self.keep:]
            return False
        new_best = member.confirmed and (self._best is None or member.fitness > self._best.fitness)
        if new_best:
            self._best = member
        self.accepted.append(member)
        self.accepted.sort(key=lambda m: m.fitness, reverse=True)
        elite = self.elites.get(member.niche)
        if elite is None or member.fitness > elite.fitness:
            self.elites[member.niche] = member
        del self.accepted[self.keep:]
        return new_best

    def settle(self, member: Member) -> bool:
        """``member``, added before its audit was made (a stopped run left it unaudited), with that
        audit now (``audit_passed`` set): taken out and added again, so a passed audit may make it
        the best and a failed one demotes it. True when it is the new best."""
        if member.audit_passed is None or member.code not in self._codes:
            raise ValueError("settle takes an audited member already in the population")
        self.accepted = [m for m in self.accepted if m.code != member.code]
        self.elites = {n: e for n, e in self.elites.items() if e.code != member.code}
        for m in self.accepted:  # a niche whose elite it was has the next fittest as its elite
            if m.niche not in self.elites or m.fitness > self.elites[m.niche].fitness:
                self.elites[m.niche] = m
        if self._best is not None and self._best.code == member.code:
            self._best = max((m for m in self.accepted if m.confirmed), key=lambda m: m.fitness, default=None)
        self._codes.discard(member.code)
        return self.add(member)

    def set_seed(self, code: str) -> None:
        """The task's seed kernel, a parent before anything is judged (its verdict comes later)."""
        if code not in self._codes:
            self.seed = Member(code, None, proposer="seed")

    # ---- choosing -----------------------------------------------------------------------------
    def strategies(self) -> tuple[str, ...]:
        """The strategies that have a parent to work with now (``fresh`` always has)."""
        out = []
        if self.accepted or self.seed is not None:
            out += ["improve", "explore"] if len(self.accepted) > 1 else ["improve"]
        if self.failures:
            out.append("repair")
        out.append("fresh")
        return tuple(out)

    def choose(self, strategy: str) -> Choice:
        """A parent and inspirations for ``strategy``; falls back to ``improve``, then ``fresh``,
        when the strategy has nothing to work with."""
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}")
        if strategy == "repair" and self.failures:
            parent = self.failures.pop(0)  # newest first; each failure is repaired once
        elif strategy == "explore":
            parent = self._explore()
        elif strategy in ("improve", "repair"):
            strategy, parent = "improve", self._improve()
        else:
            parent = None
        if parent is None:
            strategy = "fresh"
        return Choice(strategy, parent, self.inspirations(parent))

    def _lead(self) -> Member | None:
        """The best, else (nothing audited yet) the fittest kept kernel."""
        return self._best or (self.accepted[0] if self.accepted else None)

    def _improve(self) -> Member | None:
        if not self.accepted:
            return self._best or self.seed
        if len(self.accepted) == 1 or self.rng.random() < 0.5:
            return self._lead()
        drawn = self.rng.sample(self.accepted, min(3, len(self.accepted)))
        return max(drawn, key=lambda m: m.fitness)

    def _explore(self) -> Member | None:
        best = self._lead()
        if best is None:
            return self.seed
        others = [m for n, m in sorted(self.elites.items()) if n != best.niche]
        if not others:
            others = [m for m in self.accepted if m is not best]
        return self.rng.choice(others) if others else best

    def inspirations(self, parent: Member | None, k: int = 3) -> tuple[Member, ...]:
        """The best and the other niches' elites, fastest first, without the parent's code."""
        pool = ([self.best] if self.best else []) + sorted(self.elites.values(), key=lambda m: m.fitness, reverse=True)
        out: list[Member] = []
        for m in pool:
            if (parent is None or m.code != parent.code) and all(m.code != o.code for o in out):
                out.append(m)
        return tuple(out[:k])

    def compile_times(self) -> tuple[tuple[str, float], ...]:
        """torch.compile's time per public shape label, as the judge measured it beside the accepted
        kernels known here (GPU timings only; the median where several measured one shape)."""
        seen: dict[str, list[float]] = {}
        for m in (*self.accepted, *self.demoted):
            for s in m.verdict.shapes:
                if s.compile_us and ranked(s):
                    seen.setdefault(s.label, []).append(s.compile_us)
        return tuple((label, statistics.median(times)) for label, times in seen.items())

    def tunable(self) -> list[Member]:
        """Parents for the offline tuner, in order: the best, the other elites, then the seed."""
        out: list[Member] = []
        lead = [self._lead()] if self._lead() else []
        for m in [*lead, *sorted(self.elites.values(), key=lambda m: m.fitness, reverse=True), *self.accepted]:
            if all(m.code != o.code for o in out):
                out.append(m)
        if self.seed is not None:
            out.append(self.seed)
        return out
