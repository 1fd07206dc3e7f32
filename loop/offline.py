"""The offline proposer: tunes the launch knobs of Triton kernels. No LLM, no GPU, no tokens.

``kernforge run`` uses it when no API key is configured, so a run improves the task's seed kernel
(and archived kernels) out of the box: block sizes, ``num_warps``, ``num_stages``, ``num_ctas``
(where the GPU has thread-block clusters), each ``tl.load``'s eviction hint and a float32
``tl.dot``'s precision ("ieee" or "tf32x3", tried first of its distance; see ``knobs.py``
for what counts as a knob and what is left alone, and why).

Interface (what the loop calls)::

    proposer = OfflineProposer(seed=0, clusters=False)  # clusters: knobs.clusters_in(environment)
    result = proposer.propose(parent_source, parent_feedback, history)
    if isinstance(result, NoProposal):
        ...  # result.reason says why; result.kind is "nothing_to_tune" or "exhausted"
    else:
        ...  # evaluate result.source; result.description says what changed; no tokens spent
    proposer.record(result.source, verdict)  # optional, as soon as the verdict is in

- ``parent_source``: a candidate module (the task's seed, or an archived kernel). Its own
  configuration counts as tried: the loop evaluates the parent itself.
- ``parent_feedback``: the parent's ``Verdict`` (``verifier.verdict``), or None when it has not
  been judged. Read: whether it was accepted, its GPU-timed shapes' ``time_us``, and a rejection's
  reason and evidence (did it run out of shared memory).
- ``history``: ``(source, Verdict or None)`` pairs of candidates already evaluated or in
  flight, e.g. the task's archived attempts on a resumed run. Passing a pair again changes
  nothing; ``record`` takes one pair. None as the verdict means "tried, result not known yet".
- A ``Proposal`` holds ``source`` (the candidate module), ``description`` (one line: which knobs
  changed, from which configuration and its time), ``config`` and ``base`` (knob values of the
  candidate and of the configuration it moved from), ``code_hash`` (``archive.content.code_hash``
  of the source) and ``model`` ("offline"). It costs no tokens and no money.
- ``proposer.reach(source, widening=...)``: how many configurations of ``source``'s knobs the
  search can ever propose (the parent's own included) and how many of them were tried already, so
  a run can say up front that its attempt budget will not be reached. ``widening``: GPU times
  will move the search, so block sizes may widen as far as they can go.

Every source whose kernels differ from another's only in knob values belongs to one *family*
(``knobs.template_key``); the proposer keeps per family the configurations tried and their per-shape
times. It proposes around the best measured configuration of the parent's family (the parent's own
while nothing is measured): first the same single-knob move that led to the best (it paid off once),
then untried configurations at distance 1, 2, ... (steps along the knobs' domains; a categorical
knob, an eviction hint or a dot's precision, has its values in a fixed order, so a step is one place
along it) in an order drawn from the seed, a move of a dot's precision first of its distance,
skipping any whose block sizes and num_stages are all at least those of a configuration that ran
out of shared memory (warps, clusters, hints and precisions do not count), and any that launches a
kernel with a cluster (num_ctas) at least as large as one Triton failed to compile it with. A
configuration becomes the best only when it is more than ``MARGIN`` (1%) faster, so timing noise
does not move the search; a rejected one never does, and neither does one judged on the interpreter:
its times are correctness runs' wall clock, never ranked, so on a CPU the search stays centred on
the parent and walks its neighbourhood in the seeded order until it is exhausted. A knob's values
are powers of two around its first value and around every later best, so a knob that keeps improving
at the edge of its range gets a wider one. No configuration is proposed twice;
``NoProposal(kind="exhausted")`` comes once everything within reach was tried. The same seed and the
same calls give the same proposals.
Not thread-safe: one loop, one proposer.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from kernforge.archive.content import code_hash, text_hash
from kernforge.archive.score import geomean, partly_timed, ranked
from kernforge.archive.tables import fmt_us
from kernforge.verifier.verdict import Verdict

from .knobs import Analysis, analyse, rewrite, template_key

Config = tuple  # one value per knob (int, str or None), in the family's knob order
#: A configuration displaces the best only when it is faster by more than this fraction.
MARGIN = 0.01


@dataclass(frozen=True)
class Proposal:
    """A candidate to evaluate: the parent's kernel with some knobs changed."""

    source: str
    description: str
    #: every knob's value in ``source``, by label
    config: Mapping[str, int | str | None]
    #: the configuration it was derived from (the best known, else the parent's)
    base: Mapping[str, int | str | None]
    code_hash: str
    model: str = "offline"

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "description": self.description, "config": dict(self.config),
                "base": dict(self.base), "code_hash": self.code_hash, "model": self.model}


@dataclass(frozen=True)
class NoProposal:
    """Nothing to propose, and why: ``kind`` is "nothing_to_tune" or "exhausted"."""

    reason: str
    kind: str


@dataclass(frozen=True)
class Reach:
    """How far the search can go from one kernel's family of configurations."""

    family: str  # knobs.template_key of the family
    labels: tuple[str, ...]
    #: configurations within reach, the parent's own included
    total: int
    #: how many of them were already tried (recorded, proposed or primed from the archive)
    tried: int
    #: how many families the counts add up (OfflineTuner.reach: one per kernel it starts from)
    families: int = 1

    @property
    def left(self) -> int:
        return self.total - self.tried


@dataclass
class _Family:
    key: str
    template: str
    analysis: Analysis
    labels: tuple[str, ...]
    #: configurations the domains are centred on: the first one seen, then each new best
    anchors: list[Config]
    tried: set[Config] = field(default_factory=set)
    #: per-shape times of each judged configuration; None for a rejection
    times: dict[Config, dict[str, float] | None] = field(default_factory=dict)
    #: proposed configuration -> (knob index, step) of the single move that made it
    moves: dict[Config, tuple[int, int]] = field(default_factory=dict)
    #: configurations that ran out of shared memory
    too_big: set[Config] = field(default_factory=set)
    #: knob index of a launch's num_ctas -> the smallest cluster it failed to compile with
    no_cluster: dict[int, int] = field(default_factory=dict)

    def needs_more_memory(self, config: Config) -> bool:
        """At least the block sizes and stages of one that ran out of shared memory
        (``Knob.grows_shared_memory``)."""
        grows = [i for i, k in enumerate(self.analysis.knobs) if k.grows_shared_memory]
        return any(all(_ge(config[i], big[i]) for i in grows) for big in self.too_big)

    def cluster_fails(self, config: Config) -> bool:
        """A launch's num_ctas at least one its kernel failed to compile with."""
        return any(isinstance(config[i], int) and config[i] >= least for i, least in self.no_cluster.items())

    def ruled_out(self, config: Config) -> bool:
        return self.needs_more_memory(config) or self.cluster_fails(config)

    def clusters_failed(self, config: Config) -> None:
        """``config`` failed to compile: each of its launches with num_ctas > 1 is taken to be why
        (Triton 3.6's Hopper pipeline refused fused_moe's gate-up kernel at num_ctas=2 on an H100,
        "PassManager::run failed" in make_ttgir), so no larger cluster is tried for it either."""
        for i, knob in enumerate(self.analysis.knobs):
            value = config[i]
            if knob.kind == "option" and knob.param == "num_ctas" and isinstance(value, int) and value > 1:
                self.no_cluster[i] = min(value, self.no_cluster.get(i, value))

    def domains(self, *extra: Config) -> list[tuple]:
        anchors = [*self.anchors, *extra]
        return [k.domain(*(a[i] for a in anchors)) for i, k in enumerate(self.analysis.knobs)]

    def best(self) -> tuple[Config, float, int] | None:
        """The fastest accepted configuration: (config, geometric-mean µs, shapes compared)."""
        measured = {c: t for c, t in self.times.items() if t}
        if not measured:
            return None
        # Compare on the shapes every measurement has, when there are any (one run: all).
        common = set.intersection(*(set(t) for t in measured.values()))

        def score(c: Config) -> float:
            keys = common or measured[c].keys()
            return geomean(measured[c][k] for k in keys) or math.inf  # times are positive: never inf

        # In the order they were measured: a newcomer must beat the incumbent by more than
        # timing noise, else the search would wander between equally fast configurations.
        config = next(iter(measured))
        for other in measured:
            if score(other) < score(config) * (1 - MARGIN):
                config = other
        return config, score(config), len(common or measured[config])


class OfflineProposer:
    """Coordinate search over launch knobs, seeded; see the module docstring for the interface."""

    name = "offline"

    def __init__(self, *, seed: int = 0, clusters: bool = False) -> None:
        self.seed = seed
        self.clusters = clusters
        self._families: dict[str, _Family] = {}
        self._located: dict[str, tuple[_Family, Config] | str] = {}

    def propose(
        self,
        parent_source: str,
        parent_feedback: Verdict | None = None,
        history: Iterable[tuple[str, Verdict | None]] = (),
    ) -> Proposal | NoProposal:
        for source, feedback in history:
            self.record(source, feedback)
        located = self._locate(parent_source)
        if isinstance(located, str):
            return NoProposal(located, "nothing_to_tune")
        fam, parent = located
        self.record(parent_source, parent_feedback)
        best = fam.best()
        centre = best[0] if best else parent
        if centre not in fam.anchors:
            fam.anchors.append(centre)
        domains = fam.domains()
        config, move = self._next(fam, centre, domains)
        base = dict(zip(fam.labels, centre))
        if config is None:
            size = math.prod(len(d) for d in domains)
            memory = clusters = 0
            for c in itertools.product(*domains):
                if c not in fam.tried:
                    big = fam.needs_more_memory(c)
                    memory += big
                    clusters += not big and fam.cluster_fails(c)
            why = [f"{memory} need more shared memory than one that ran out"] * bool(memory) \
                + [f"{clusters} launch a cluster as large as one that failed to compile"] * bool(clusters)
            return NoProposal(
                f"exhausted: all {size} configurations of {', '.join(fam.labels)} within reach have been "
                f"tried" + (f" or skipped ({'; '.join(why)})" if why else "")
                + f"; best: {_describe(base)}" + (f" at {fmt_us(best[1])}" if best else " (nothing measured on a GPU)"),
                "exhausted",
            )
        fam.tried.add(config)
        if move is not None:
            fam.moves[config] = move
        source = rewrite(fam.template, fam.analysis, dict(zip(fam.labels, config)))
        values = dict(zip(fam.labels, config))
        self._located[text_hash(source)] = (fam, config)
        changes = ", ".join(f"{k} {_show(base[k])}→{_show(v)}" for k, v in values.items() if v != base[k])
        kernels = ", ".join(dict.fromkeys(k.kernel for k in fam.analysis.knobs))
        origin = "the parent's configuration (nothing measured on a GPU yet)"
        if best:
            shapes = f"{best[2]} shape" + "s" * (best[2] != 1)
            origin = f"the best measured configuration ({fmt_us(best[1])}, geometric mean over {shapes})"
        return Proposal(source, f"offline tuning of {kernels}: {changes}, from {origin}",
                        values, base, code_hash(source))

    def reach(self, source: str, *, widening: bool = False) -> Reach | None:
        """Configurations of ``source``'s family within reach of it, and how many were tried; None
        when it has no knobs. Without ``widening`` (interpreter times never move the search) the
        domains stay where they are; with it, every knob's widest domain (an upper bound)."""
        located = self._locate(source)
        if isinstance(located, str):
            return None
        fam, config = located
        if widening:
            domains = [k.widest() for k in fam.analysis.knobs]
        else:
            domains = fam.domains(config)
        tried = sum(1 for c in fam.tried if all(v in d for v, d in zip(c, domains)))
        return Reach(fam.key, fam.labels, math.prod(len(d) for d in domains), tried)

    def record(self, source: str, feedback: Verdict | None) -> None:
        """Note that ``source`` was tried and, when ``feedback`` is given, how it fared."""
        located = self._locate(source)
        if isinstance(located, str):
            return
        fam, config = located
        fam.tried.add(config)
        if feedback is not None:
            fam.times[config] = _times(feedback)
            if _out_of_shared_memory(feedback):
                fam.too_big.add(config)
            elif _failed_to_compile(feedback):
                fam.clusters_failed(config)

    def _locate(self, source: str) -> tuple[_Family, Config] | str:
        """The family and configuration of ``source``, or why it has no knobs."""
        h = text_hash(source)
        if h not in self._located:
            analysis = analyse(source, clusters=self.clusters)
            if not analysis.knobs:
                self._located[h] = analysis.reason
            else:
                key = template_key(source, analysis)
                values = analysis.values()
                fam = self._families.get(key)
                if fam is None:
                    labels = tuple(values)
                    fam = self._families[key] = _Family(key, source, analysis, labels, [tuple(values.values())])
                self._located[h] = (fam, tuple(values[label] for label in fam.labels))
        return self._located[h]

    def _next(self, fam: _Family, centre: Config, domains: list[tuple]) -> tuple[Config | None, tuple | None]:
        index = [d.index(v) for d, v in zip(domains, centre)]
        # The move that produced the centre improved on its base: try it once more.
        if centre in fam.moves:
            i, step = fam.moves[centre]
            j = index[i] + step
            if 0 <= j < len(domains[i]):
                config = centre[:i] + (domains[i][j],) + centre[i + 1:]
                if config not in fam.tried and not fam.ruled_out(config):
                    return config, (i, step)
        sizes = [len(d) for d in domains]
        reach = sum(max(ix, n - 1 - ix) for ix, n in zip(index, sizes))
        for distance in range(1, reach + 1):
            ranked = []
            for offsets in _ring(index, sizes, distance):
                config = tuple(d[ix + o] for d, ix, o in zip(domains, index, offsets))
                if config not in fam.tried and not fam.ruled_out(config):
                    ranked.append((self._first(fam, offsets), self._rank(fam, config), config, offsets))
            if ranked:
                _, _, config, offsets = min(ranked)
                moved = [(i, o) for i, o in enumerate(offsets) if o]
                return config, moved[0] if distance == 1 else None
        return None, None

    @staticmethod
    def _first(fam: _Family, offsets: tuple) -> int:
        """0 for a configuration that moves a tl.dot's precision (knobs.py), so it comes first of
        its distance: ieee to tf32x3 takes a float32 GEMM from the CUDA cores to the tensor cores,
        a larger step than any tile size (KernelBench's float32 GEMMs started at 0.44-0.82x of
        torch.compile on an H100 on the CUDA cores); 1 for every other."""
        kinds = [fam.analysis.knob(label).kind for label in fam.labels]
        return 0 if any(o and kinds[i] == "precision" for i, o in enumerate(offsets)) else 1

    def _rank(self, fam: _Family, config: Config) -> bytes:
        """A seeded pseudo-random order that does not depend on the order of earlier calls."""
        return hashlib.blake2b(f"{self.seed}|{fam.key}|{config!r}".encode(), digest_size=8).digest()


def _ring(index: list[int], sizes: list[int], distance: int):
    """Offsets with sum of |offset| == distance that stay inside every domain."""
    if not index:
        if distance == 0:
            yield ()
        return
    ix, n = index[0], sizes[0]
    for o in range(-min(distance, ix), min(distance, n - 1 - ix) + 1):
        for rest in _ring(index[1:], sizes[1:], distance - abs(o)):
            yield (o, *rest)


def _times(feedback: Verdict) -> dict[str, float] | None:
    """Per-shape GPU device times of an accepted verdict's public shapes (µs), keyed by shape;
    None if rejected. Interpreter shapes are left out (empty for a CPU verdict): accepted, but
    nothing to rank by."""
    if not feedback.accepted:
        return None
    if partly_timed(feedback.shapes):  # slower than the best at a shape (verifier/contender.py): nothing to rank
        return {}
    return {json.dumps([dict(s.shape), s.hidden, s.dtype], sort_keys=True): float(s.time_us)
            for s in feedback.shapes if ranked(s) and math.isfinite(s.time_us)}


def _out_of_shared_memory(feedback: Verdict) -> bool:
    """Triton's OutOfResources message, anywhere in a rejection's reason or evidence."""
    if feedback.accepted:
        return False
    text = json.dumps({"reason": feedback.reason, "evidence": dict(feedback.evidence)}, default=str).lower()
    return "out of resource" in text and "shared memory" in text


def _failed_to_compile(feedback: Verdict) -> bool:
    """Triton's compiler pipeline refused the kernel ("PassManager::run failed"), anywhere in a
    rejection's reason or evidence."""
    if feedback.accepted:
        return False
    text = json.dumps({"reason": feedback.reason, "evidence": dict(feedback.evidence)}, default=str)
    return "PassManager::run failed" in text


def _ge(a: int | None, b: int | None) -> bool:
    return a is None or (b is not None and a >= b)  # None: uncapped, larger than any cap


def _show(value: int | str | None) -> str:
    return "uncapped" if value is None else "default" if value == "" else str(value)


def _describe(values: Mapping[str, int | str | None]) -> str:
    return " ".join(f"{k}={_show(v)}" for k, v in values.items())
