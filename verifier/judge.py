"""The judge: decides, for one candidate and one task, accepted or rejected, and how fast.

Runs in the trusted process. The candidate runs in a sandboxed worker (harness.py); references,
comparisons and baselines run in a trusted reference worker (refworker.py). The judge reveals
each (shape, distribution, seed) only when the candidate must compute it, checks every element
of every output on the public and hidden shapes, then times the candidate (timing.py) and
bounds every reported time by its own clock. Both workers come from sandbox backends handed in
by the caller (the loop or the CLI wiring), so this module knows no sandbox implementation.
"""

from __future__ import annotations

import math
import os
import secrets
import stat
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from kernforge.sandbox.protocol import Backend, FailureKind, Limits, Session, WorkerFailure
from kernforge.tasks import runtime
from kernforge.tasks.loader import bundle
from kernforge.tasks.spec import Shape, Task

from . import decide
from .cache import JsonCache, default_dir, key_of
from .kernels import own_kernel_names
from .screen import screen
from .verdict import Accepted, Rejected, ShapeResult, Status, Verdict

HARNESS_ENTRY = "kernforge.verifier.harness:run"
HARNESS_WARMUP = "kernforge.verifier.harness:warm_up"
REFERENCE_ENTRY = "kernforge.verifier.refworker:run"
REFERENCE_WARMUP = "kernforge.verifier.refworker:warm_up"
HARNESS_PRELOAD = ("torch", "triton", "kernforge.verifier.harness")
REFERENCE_PRELOAD = ("torch", "triton", "kernforge.verifier.refworker")


class JudgeError(Exception):
    """The judge itself could not work (the task's reference failed, a worker would not start)."""


@dataclass(frozen=True)
class JudgeOptions:
    #: "cpu" (Triton interpreter) or "cuda" (the GPU the backends are pinned to)
    device: str = "cpu"
    timing_reps: int = 100
    timing_sets: int = 3
    time_hidden: bool = True
    #: which public shapes to time: "all", or "largest" (by roofline bytes; benchmarks)
    time_shapes: str = "all"
    cpu_timing_reps: int = 2
    message_timeout_s: float = 600.0
    limits: Limits = field(default_factory=Limits)
    baselines: bool = True
    #: the parent's own clock must see at least this long a run of back-to-back calls
    throughput_seconds: float = 0.25
    #: measured ceilings sit below the datasheet: the floor allows this much headroom above them
    floor_headroom: float = 1.2
    #: a reported median below this fraction of the parent's per-call wall time is impossible
    wall_ratio: float = 0.4
    cache_dir: Path | None = None
    #: tests switch the static screen off to show each runtime defence working on its own
    static_screen: bool = True


@dataclass
class _Progress:
    """Worst errors seen per shape while checking, reported with the timings."""

    errors: dict[tuple, tuple[float, float]] = field(default_factory=dict)
    #: checksums of the candidate's earlier outputs per shape: a repeat on new inputs is a cache
    outputs: dict[tuple, list[list[Any]]] = field(default_factory=dict)
    #: checksums of earlier references per shape: matching one is an answer deferred a call
    references: dict[tuple, list[list[Any]]] = field(default_factory=dict)


@dataclass
class _Pending:
    """A check sent to the candidate whose reply has not been read yet."""

    shape: Shape
    dist: str
    hidden: bool
    key: str
    ref: dict[str, Any]
    msg: dict[str, Any]


class Judge:
    def __init__(self, candidates: Backend, references: Backend, options: JudgeOptions = JudgeOptions()):
        self.candidates = candidates
        self.references = references
        self.options = options
        self.on_gpu = options.device.startswith("cuda")
        self.worker_device = "cuda:0" if self.on_gpu else "cpu"  # pools pin one GPU each
        cache_dir = options.cache_dir or default_dir()
        self.baseline_cache = JsonCache(cache_dir / "baselines.json")
        self.ceiling_cache = JsonCache(cache_dir / "ceilings.json")
        self._ref: Session | None = None
        self._env: dict[str, Any] | None = None
        #: seconds spent per step of the verdict in progress ("ref.compare", "worker.check", ...)
        self._phases: dict[str, float] = {}
        #: references the reference worker holds for the verdict in progress (freed at its end)
        self._live_refs: set[str] = set()
        #: checks sent to the candidate's worker so far: their parity names the output slot
        self._sent_checks = 0

    def _spent(self, step: str, since: float) -> None:
        self._phases[step] = self._phases.get(step, 0.0) + time.perf_counter() - since

    def _add_steps(self, prefix: str, steps: Any) -> None:
        """A worker's own breakdown of one request (diagnostics, never evidence: a candidate's
        worker may report anything, so only finite numbers under short names are kept)."""
        if not isinstance(steps, dict):
            return
        for name, seconds in list(steps.items())[:16]:
            if isinstance(seconds, (int, float)) and math.isfinite(seconds):
                step = f"{prefix}:{str(name)[:20]}"
                self._phases[step] = self._phases.get(step, 0.0) + float(seconds)

    # ---- the reference worker ------------------------------------------------------------------
    def _ref_session(self) -> Session:
        if self._ref is None:
            self._ref = self.references.session(
                REFERENCE_ENTRY, {"device": self.worker_device}, Limits(wall_seconds=None, cpu_seconds=10**7, memory_bytes=self.options.limits.memory_bytes * 2)
            )
        return self._ref

    def _ask_ref(self, msg: Mapping[str, Any], timeout: float | None = None) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            return self._ask_ref_once(msg, timeout)
        finally:
            self._spent(f"ref.{msg.get('op')}", t0)

    def _ask_ref_once(self, msg: Mapping[str, Any], timeout: float | None) -> dict[str, Any]:
        for attempt in (1, 2):
            try:
                session = self._ref_session()
                session.send(msg)
                reply = session.recv(timeout or self.options.message_timeout_s)
                break
            except WorkerFailure as failure:
                self._drop_ref()
                if attempt == 2:
                    raise JudgeError(f"the reference worker failed: {failure.reason}") from failure
        if not reply.get("ok"):
            raise JudgeError(f"the task's reference failed on {msg.get('op')}: {reply.get('error')}")
        if msg.get("op") == "reference":
            self._live_refs.add(msg["key"])
        elif msg.get("op") in ("drop", "compare"):
            self._live_refs.discard(msg["key"])
        self._add_steps(f"ref.{msg.get('op')}", reply.get("steps"))
        return reply

    def _drop_ref(self) -> None:
        if self._ref is not None:
            try:
                self._ref.close()
            finally:
                self._ref = None

    def environment(self) -> dict[str, Any]:
        if self._env is None:
            self._env = self._ask_ref({"op": "environment"})["environment"]
        return self._env

    def ceilings(self) -> dict[str, Any]:
        """Copy bandwidth (GB/s) and bf16 matmul rate (TFLOP/s), measured once per GPU."""
        if not self.on_gpu:
            return {"bandwidth_gbps": None, "tflops": None}
        env = self.environment()
        key = key_of("ceilings", env.get("gpu"), env.get("driver"), env.get("torch"), env.get("cuda"))
        cached = self.ceiling_cache.get(key)
        if cached is None:
            cached = self._ask_ref({"op": "ceilings"})
            cached = {"bandwidth_gbps": cached["bandwidth_gbps"], "tflops": cached["tflops"]}
            self.ceiling_cache.put(key, cached)
        return cached

    def close(self) -> None:
        if self._ref is not None:
            try:
                self._ref.send({"op": "done"})
            except (WorkerFailure, OSError):
                pass
        self._drop_ref()

    # ---- one candidate -------------------------------------------------------------------------
    def verify(self, source: str, task: Task) -> Verdict:
        started = time.perf_counter()
        self._phases = {}
        try:
            verdict = self._verify(source, task)
        finally:  # a rejection or a worker failure mid-check leaves references behind
            for key in list(self._live_refs):
                try:
                    self._ask_ref({"op": "drop", "key": key})
                except JudgeError:
                    self._live_refs.clear()
                    break
        env = dict(self.environment())
        env["verify_seconds"] = round(time.perf_counter() - started, 3)
        env["phase_seconds"] = {k: round(v, 3) for k, v in sorted(self._phases.items(), key=lambda kv: -kv[1])}
        if isinstance(verdict, Accepted):
            return Accepted(shapes=verdict.shapes, reason=verdict.reason, flags=verdict.flags, environment=env)
        return Rejected(verdict.status, verdict.reason, verdict.threat, verdict.evidence, verdict.shapes, env)

    def _verify(self, source: str, task: Task) -> Verdict:
        found = screen(source, allow_torch_ops=task.allow_torch_ops)
        if self.options.static_screen and not found.ok:
            first = found.findings[0]
            return Rejected(Status.STATIC_REJECTED, found.reason, threat=first.threat,
                            evidence={"check": "static screen", "findings": [f.to_dict() for f in found.findings[:20]]})
        own = own_kernel_names(source)
        init_seed = secrets.randbits(31)
        payload = {"task": bundle(task), "source": source, "device": self.worker_device, "init_seed": init_seed}
        try:
            t0 = time.perf_counter()
            with self.candidates.session(HARNESS_ENTRY, payload, self.options.limits) as session:
                self._spent("worker.start", t0)
                reply = self._call(session, {"op": "load"}, "loading the module")
                if isinstance(reply, Rejected):
                    return reply
                rejection = decide.tampering(reply.get("tampered", []), "while the module was imported")
                if rejection is None and reply.get("new_threads"):
                    rejection = Rejected(Status.CHEAT, f"importing the module started threads {reply['new_threads'][:3]}", threat=6,
                                         evidence={"check": "threads"})
                if rejection is not None:
                    return rejection
                progress = _Progress()
                for hidden in (False, True):  # hidden shapes only once every public one passed
                    rejection = self._check_all(session, task, hidden, init_seed, own, progress)
                    if rejection is not None:
                        return rejection
                results = self._time_all(session, task, init_seed, own, progress)
                if isinstance(results, Rejected):
                    return results
                try:
                    session.send({"op": "done"})
                except (WorkerFailure, OSError):
                    pass
        except WorkerFailure as failure:
            return _failure_verdict(failure)
        shapes, flags = results
        return Accepted(shapes=tuple(shapes), flags=tuple(sorted(set(flags))))

    def _call(self, session: Session, msg: dict[str, Any], what: str) -> dict[str, Any] | Rejected:
        self._send(session, msg)
        return self._reply(session, msg, what)

    def _send(self, session: Session, msg: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        try:
            session.send(msg)
        finally:
            self._spent(f"worker.{msg['op']}", t0)

    def _reply(self, session: Session, msg: dict[str, Any], what: str) -> dict[str, Any] | Rejected:
        """The worker's answer to ``msg`` (sent before): its structure checked, failures as verdicts."""
        t0 = time.perf_counter()
        try:
            reply = session.recv(self.options.message_timeout_s)
        finally:
            self._spent(f"worker.{msg['op']}", t0)
        if isinstance(reply, dict):
            self._add_steps(f"worker.{msg['op']}", reply.get("steps"))
        bad = decide.malformed(reply, ["ok"])
        if bad is not None:
            return bad
        if reply.get("op") != msg["op"]:
            return decide.malformed({}, ["op"])
        if not reply["ok"]:
            stage = reply.get("stage")
            error = str(reply.get("error", ""))[-3000:]
            status = {"compile": Status.COMPILE_ERROR}.get(stage, Status.RUNTIME_ERROR)
            headline = error.strip().splitlines()[-1] if error.strip() else "no message"
            return Rejected(status, f"{'compiling' if status is Status.COMPILE_ERROR else 'running'} failed while {what}: {headline}",
                            evidence={"check": stage or "runtime", "error": error, "while": what})
        return reply

    # ---- correctness ---------------------------------------------------------------------------
    def _check_all(self, session: Session, task: Task, hidden: bool, init_seed: int, own: list[str],
                   progress: _Progress) -> Rejected | None:
        """Check every (shape, distribution) of one group, public or hidden, in order.

        Pipelined: once a call's reply has passed the structural checks, the next call goes to
        the candidate; while it computes, the reference worker compares the last call's outputs
        and computes the reference of the call after next. Outputs are still judged one call at
        a time, in order, and a call is revealed to the candidate only when it is sent.
        """
        kind = "cuda" if self.on_gpu else "cpu"
        items = [(shape, dist) for shape in task.shapes(kind, hidden=hidden) for dist in task.distributions]
        if not items:
            return None
        sent = self._prepare_check(task, *items[0], hidden, init_seed)
        self._send(session, sent.msg)
        ready = self._prepare_check(task, *items[1], hidden, init_seed) if len(items) > 1 else None
        for n in range(len(items)):
            following = items[n + 2] if n + 2 < len(items) else None
            rejection, sent, ready = self._finish_check(session, task, sent, ready, following, init_seed, own, progress)
            if rejection is not None:
                return rejection
        return None

    def _prepare_check(self, task: Task, shape: Shape, dist: str, hidden: bool, init_seed: int) -> _Pending:
        """The reference of one call, computed now, and the message that will reveal the call."""
        key = uuid.uuid4().hex
        seed = secrets.randbits(31)
        ref = self._ask_ref({"op": "reference", "key": key, "task_ref": task.ref, "shape": shape.as_dict(),
                             "dist": dist, "seed": seed, "init_seed": init_seed})
        # Two output slots: the worker writes one while the reference worker reads the other.
        self._sent_checks += 1
        msg = {"op": "check", "id": key[:12], "shape": shape.as_dict(), "dist": dist, "seed": seed,
               "poison_bytes": ref["output_bytes"], "slot": self._sent_checks % 2}
        return _Pending(shape, dist, hidden, key, ref, msg)

    def _abandon(self, session: Session, pending: _Pending | None, *, drain: bool = False) -> bool:
        """Forget a call sent ahead; with ``drain``, wait for its reply first (the worker must be
        idle before it is asked anything else). True when the worker is idle again."""
        if pending is None:
            return True
        self._ask_ref({"op": "drop", "key": pending.key})
        if not drain:
            return False
        try:
            return not isinstance(self._reply(session, pending.msg, "finishing a call sent ahead"), Rejected)
        except WorkerFailure:
            return False

    def _finish_check(self, session: Session, task: Task, p: _Pending, ready: _Pending | None,
                      following: tuple[Shape, str] | None, init_seed: int, own: list[str],
                      progress: _Progress) -> tuple[Rejected | None, _Pending | None, _Pending | None]:
        """Judge call ``p`` (sent), sending ``ready`` (prepared) meanwhile and preparing
        ``following``; returns (rejection, the call now in flight, the next one prepared)."""
        shape, hidden, key, ref = p.shape, p.hidden, p.key, p.ref
        ctx = decide.where(shape.as_dict(), hidden, p.dist)
        reply = self._reply(session, p.msg, f"checking the {ctx}")
        if isinstance(reply, Rejected):
            self._ask_ref({"op": "drop", "key": key})
            return _with_shape(reply, shape, hidden), None, None
        bad = decide.malformed(reply, ["types", "outputs"])
        if bad is None and all(t == "torch.Tensor" for t in reply["types"]):
            bad = decide.malformed(reply, ["late_writes", "aliases", "input_digests", "input_shapes", "torch_ops",
                                           "launches", "gpu_kernels", "new_threads", "repeat", "tampered"])
        rejection = bad or decide.call_facts(reply, ref, ctx=ctx, mutated=task.mutated_inputs,
                                             allow_torch_ops=task.allow_torch_ops, own_kernels=own, on_gpu=self.on_gpu)
        rejection = rejection or _foreign_files(reply["outputs"], session.workdir, ctx)
        if rejection is not None:
            self._ask_ref({"op": "drop", "key": key})
            return _with_shape(rejection, shape, hidden), None, None
        # The candidate computes the next call while its outputs are compared here.
        nxt = ready
        if nxt is not None:
            self._send(session, nxt.msg)
        cmp = self._ask_ref({"op": "compare", "key": key, "files": reply["outputs"], "tolerances": task.tolerance_table()})
        if cmp.get("count_mismatch"):
            self._abandon(session, nxt)
            return _with_shape(Rejected(Status.INCORRECT, f"forward produced {cmp['count_mismatch']} ({ctx})",
                                        evidence={"check": "outputs"}), shape, hidden), None, None
        sums = [r.get("checksum") for r in cmp["results"]]
        earlier = progress.outputs.setdefault(shape.params, [])
        earlier_refs = progress.references.setdefault(shape.params, [])
        stale = not all(r.get("ok") for r in cmp["results"]) and (
            sums in earlier or any(decide.same_checksum(sums, e) for e in earlier_refs))
        cached = deferred = False
        if stale:  # an earlier call's answer: one more call on new inputs tells a cache from a deferral
            if self._abandon(session, nxt, drain=True):
                probe = self._probe(session, task, shape, p.dist)
                cached = probe == sums
                deferred = not cached and decide.same_checksum(probe, ref.get("checksums", []))
            nxt = None
        earlier.append(sums)
        earlier_refs.append(ref.get("checksums", []))
        rejection = decide.mismatch(cmp["results"], ctx, hidden=hidden, public_all_passed=hidden,
                                    cached=cached, deferred=deferred)
        if rejection is None:
            limits = [r.get("allowed_abs", 0.0) for r in cmp["results"]]
            rejection = decide.repeat_consistency(reply, ctx, limits)
        if rejection is not None:
            self._abandon(session, nxt)
            return _with_shape(rejection, shape, hidden), None, None
        worst = progress.errors.get(shape.params, (0.0, 0.0))
        progress.errors[shape.params] = (
            max(worst[0], *(r.get("max_abs_err", 0.0) for r in cmp["results"])),
            max(worst[1], *(r.get("max_rel_err", 0.0) for r in cmp["results"])),
        )
        upcoming = self._prepare_check(task, *following, hidden, init_seed) if following else None
        return None, nxt, upcoming

    def _probe(self, session: Session, task: Task, shape: Shape, dist: str) -> list[Any]:
        """Checksums of the candidate's output on fresh inputs (diagnosis only, after a failure)."""
        self._sent_checks += 1  # the call sent ahead was drained and the last one compared: a slot is free
        reply = self._call(session, {"op": "check", "id": uuid.uuid4().hex[:12], "shape": shape.as_dict(), "dist": dist,
                                     "seed": secrets.randbits(31), "poison_bytes": [], "repeat": False,
                                     "slot": self._sent_checks % 2}, "probing")
        if isinstance(reply, Rejected) or not isinstance(reply.get("outputs"), list):
            return []
        if _foreign_files(reply["outputs"], session.workdir, "probing") is not None:
            return []
        return self._ask_ref({"op": "checksum", "files": reply["outputs"]})["checksums"]

    # ---- timing --------------------------------------------------------------------------------
    def _time_all(self, session: Session, task: Task, init_seed: int, own: list[str], progress: _Progress) -> tuple[list[ShapeResult], list[str]] | Rejected:
        kind = "cuda" if self.on_gpu else "cpu"
        public = list(task.shapes(kind, hidden=False))
        if self.options.time_shapes == "largest":
            public = [runtime.largest_shape(task, kind)]
        shapes = [(s, False) for s in public]
        if self.on_gpu and self.options.time_hidden and self.options.time_shapes == "all":
            shapes += [(s, True) for s in task.shapes(kind, hidden=True)]
        ceilings = self.ceilings()
        results: list[ShapeResult] = []
        flags: list[str] = []
        for shape, hidden in shapes:
            outcome = self._time_shape(session, task, shape, hidden, init_seed, own, ceilings, progress)
            if isinstance(outcome, Rejected):
                return _with_shape(outcome, shape, hidden)
            result, shape_flags = outcome
            results.append(result)
            flags += shape_flags
        return results, flags

    def _time_shape(self, session: Session, task: Task, shape: Shape, hidden: bool, init_seed: int,
                    own: list[str], ceilings: Mapping[str, Any], progress: _Progress) -> tuple[ShapeResult, list[str]] | Rejected:
        kind = "cuda" if self.on_gpu else "cpu"
        dtype = task.dtype(kind)
        dist = task.distributions[0]
        n_sets = self.options.timing_sets if self.on_gpu else 1
        sets = [{"dist": dist, "seed": secrets.randbits(31)} for _ in range(n_sets)]
        keys = [uuid.uuid4().hex for _ in sets]
        for key, s in zip(keys, sets):
            self._ask_ref({"op": "reference", "key": key, "task_ref": task.ref, "shape": shape.as_dict(),
                           "dist": s["dist"], "seed": s["seed"], "init_seed": init_seed})
        reps = self.options.timing_reps if self.on_gpu else self.options.cpu_timing_reps
        ctx = f"timing the {decide.where(shape.as_dict(), hidden, dist)}"
        t0 = time.perf_counter()
        reply = self._call(session, {"op": "time", "id": keys[0][:12], "shape": shape.as_dict(), "sets": sets,
                                     "reps": reps, "order_seed": secrets.randbits(31)}, ctx)
        wall = time.perf_counter() - t0
        if isinstance(reply, Rejected):
            return reply
        bad = decide.malformed(reply, ["mode", "times_us", "order", "checksums", "outputs", "tampered", "new_threads"])
        if bad is not None:
            return bad
        rejection = decide.tampering(reply["tampered"], f"while {ctx}") or decide.l2_pinning(reply, ctx)
        if rejection is not None:
            return rejection
        if reply["new_threads"]:
            return Rejected(Status.CHEAT, f"threads {reply['new_threads'][:3]} appeared while {ctx}", threat=6, evidence={"check": "threads"})
        times = [float(t) for t in reply["times_us"]]
        if not times or not all(math.isfinite(t) and t >= 0 for t in times) or len(reply["outputs"]) != len(sets):
            return Rejected(Status.CHEAT, f"the timing reply is malformed ({ctx})", threat=9, evidence={"check": "protocol"})
        if sum(times) / 1e6 > wall * 1.05 + 0.01:
            return Rejected(Status.CHEAT, f"reported {sum(times) / 1e3:.1f} ms of device time in {wall * 1e3:.1f} ms of the judge's clock ({ctx})", threat=9,
                            evidence={"check": "wall clock", "reported_ms": sum(times) / 1e3, "wall_ms": wall * 1e3})
        finals = []
        for k, (key, files) in enumerate(zip(keys, reply["outputs"])):
            rejection = _foreign_files(files, session.workdir, ctx)
            if rejection is not None:
                return rejection
            cmp = self._ask_ref({"op": "compare", "key": key, "files": files, "tolerances": task.tolerance_table()})
            wrong = cmp.get("count_mismatch") or decide.mismatch(cmp["results"], ctx, hidden=hidden, public_all_passed=False)
            if wrong:
                detail = wrong.reason if isinstance(wrong, Rejected) else wrong
                return Rejected(Status.CHEAT, f"timed calls returned wrong results although checked calls were right ({ctx}): {detail}", threat=13,
                                evidence={"check": "timed outputs", "set": k})
            finals.append([r["checksum"] for r in cmp["results"]])
        rejection = _checksums(reply, finals, ctx) or _graph_kernels(reply, own, ctx)
        if rejection is not None:
            return rejection
        median = statistics.median(times)
        spread = None
        if len(times) >= 4:
            q = statistics.quantiles(times, n=4)
            spread = 100.0 * (q[2] - q[0]) / median if median else None
        flags = []
        reason = str(reply.get("fallback_reason") or "")
        if reply["mode"] == "eager" and "join" in reason.lower():
            return Rejected(Status.CHEAT, f"the call forks work onto another stream that never rejoins the calling stream ({ctx}): its output is not ready when the call returns", threat=5,
                            evidence={"check": "graph capture", "error": reason})
        if reply["mode"] == "eager":
            flags.append(f"timed eagerly with a device-wide sync: {reply.get('fallback_reason')}")
        result = dict(shape=shape.as_dict(), hidden=hidden, dtype=dtype, timing=reply["mode"] if self.on_gpu else "interpreter",
                      time_us=median, spread_pct=spread)
        errs = progress.errors.get(shape.params)
        if errs:
            result.update(max_abs_err=errs[0], max_rel_err=errs[1])
        if not self.on_gpu:
            return ShapeResult(**result), flags

        line = runtime.roofline(task, shape, dtype)
        bw, fl = ceilings.get("bandwidth_gbps"), ceilings.get("tflops")
        if line is not None and bw and fl:
            floor_us = 1e6 * line.floor_seconds(bw * 1e9 * self.options.floor_headroom, fl * 1e12 * self.options.floor_headroom)
            result.update(floor_us=floor_us, gbps=line.bytes / median / 1e3, tflops=line.flops / median / 1e6,
                          pct_bandwidth=100 * line.bytes / median / 1e3 / bw, pct_flops=100 * line.flops / median / 1e6 / fl)
            if median < floor_us:
                return Rejected(Status.CHEAT, f"{median:.2f} us is faster than the hardware allows for this shape (floor {floor_us:.2f} us from {line.bytes / 1e6:.2f} MB and {line.flops / 1e9:.3f} GFLOP) ({ctx})",
                                threat=20, evidence={"check": "roofline floor", "time_us": median, "floor_us": floor_us})
        rejection = self._wall_bound(session, shape, sets[0], median, reply["mode"], ctx)
        if rejection is not None:
            return rejection
        if self.options.baselines:
            base = self._baseline(task, shape, sets, init_seed, reps)
            eager, comp = base.get("eager_us"), base.get("compile_us")
            result.update(eager_us=eager, compile_us=comp,
                          speedup_eager=eager / median if eager and median else None,
                          speedup_compile=comp / median if comp and median else None)
            if base.get("compile_error"):
                flags.append(f"torch.compile baseline unavailable: {base['compile_error'][:120]}")
        return ShapeResult(**result), flags

    def _wall_bound(self, session: Session, shape: Shape, first_set: Mapping[str, Any], median: float, mode: str, ctx: str) -> Rejected | None:
        """Back-to-back calls timed by the judge's own clock: device time can't be below it (#8)."""
        per_call = max(median, 0.5)
        unroll = int(min(64, max(1, math.ceil(50.0 / per_call))))
        calls = int(max(unroll, math.ceil(self.options.throughput_seconds * 1e6 / per_call)))
        calls = min(calls, 200_000)
        t0 = time.perf_counter()
        reply = self._call(session, {"op": "throughput", "shape": shape.as_dict(), "dist": first_set["dist"],
                                     "seed": first_set["seed"], "calls": calls, "unroll": unroll}, ctx)
        wall = time.perf_counter() - t0
        if isinstance(reply, Rejected):
            return reply
        done = reply.get("calls")
        if not isinstance(done, int) or done <= 0:
            return Rejected(Status.CHEAT, f"the throughput reply is malformed ({ctx})", threat=9, evidence={"check": "protocol"})
        wall_per_call = wall * 1e6 / done
        if mode == "graph" and median < self.options.wall_ratio * wall_per_call:
            return Rejected(Status.CHEAT, f"reported {median:.2f} us per call, but {done} back-to-back calls took {wall_per_call:.2f} us each by the judge's clock ({ctx}): the timer was fooled",
                            threat=8, evidence={"check": "wall clock", "median_us": median, "wall_per_call_us": wall_per_call})
        return None

    def _baseline(self, task: Task, shape: Shape, sets: list[dict[str, Any]], init_seed: int, reps: int) -> dict[str, Any]:
        env = self.environment()
        source = task.reference_source + (task.meta_path.read_text() if task.meta_path else "")
        key = key_of("baseline", source, shape.as_dict(), task.dtype("cuda"), env.get("gpu"), env.get("driver"),
                     env.get("torch"), env.get("triton"), env.get("cuda"))
        cached = self.baseline_cache.get(key)
        if cached is not None:
            return cached
        reply = self._ask_ref({"op": "baseline", "task_ref": task.ref, "shape": shape.as_dict(), "sets": sets,
                               "init_seed": init_seed, "reps": reps})
        out = {"eager_us": reply["eager"].get("median_us"), "eager_spread_pct": reply["eager"].get("spread_pct")}
        comp = reply.get("compile", {})
        if "error" in comp:
            out["compile_error"] = comp["error"]
        else:
            out.update(compile_us=comp.get("median_us"), compile_spread_pct=comp.get("spread_pct"))
        self.baseline_cache.put(key, out)
        return out


def _checksums(reply: Mapping[str, Any], finals: list[list[list[float]]], ctx: str) -> Rejected | None:
    """Every timed call's output must match its input set's final, reference-checked output."""
    order, sums = reply["order"], reply["checksums"]
    if len(order) != len(sums) or len(order) != len(reply["times_us"]):
        return Rejected(Status.CHEAT, f"the timing reply is malformed ({ctx})", threat=9, evidence={"check": "protocol"})
    for r, (k, per_output) in enumerate(zip(order, sums)):
        if not isinstance(k, int) or not 0 <= k < len(finals) or len(per_output) != len(finals[k]):
            return Rejected(Status.CHEAT, f"the timing reply is malformed ({ctx})", threat=9, evidence={"check": "protocol"})
        for j, (got, want) in enumerate(zip(per_output, finals[k])):
            scale = abs(want[1]) * 1e-3 + 1e-6
            if abs(got[0] - want[0]) > scale or abs(got[1] - want[1]) > scale:
                return Rejected(Status.CHEAT, f"timed call {r} returned a different output {j} than the checked result for the same inputs ({ctx}): work deferred or cached across calls",
                                threat=12, evidence={"check": "timed checksums", "call": r, "output": j})
    return None


def _foreign_files(files: Any, workdir: Path, ctx: str) -> Rejected | None:
    """Output files must be regular files directly in the candidate's own private directory:
    the trusted reference worker opens them, so a link, a FIFO or a path elsewhere is refused."""
    root = os.path.realpath(workdir)
    if not isinstance(files, list):
        files = [files]
    for meta in files:
        path = meta.get("file") if isinstance(meta, dict) else None
        ok = isinstance(path, str) and os.path.dirname(os.path.abspath(path)) == root
        if ok:
            try:
                ok = stat.S_ISREG(os.lstat(path).st_mode)
            except OSError:
                ok = False
        if not ok:
            return Rejected(Status.CHEAT, f"the harness reply names an output file outside the candidate's private directory or not a regular file ({ctx}): {str(path)[:200]}",
                            threat=9, evidence={"check": "output files", "file": str(path)[:500]})
    return None


def _graph_kernels(reply: Mapping[str, Any], own: list[str], ctx: str) -> Rejected | None:
    """Each timed graph must run one of the candidate's kernels: otherwise the work happened
    outside the captured stream (a side stream at capture time) and the timer saw none of it."""
    if reply.get("mode") != "graph":
        return None
    for k, names in enumerate(reply.get("graph_kernels", [])):
        if not any(o in name for name in names for o in own):
            return Rejected(Status.CHEAT, f"the timed CUDA graph for input set {k} runs none of the candidate's kernels ({ctx}): its work ran outside the timed stream", threat=5,
                            evidence={"check": "graph contents", "graph_kernels": list(names)[:20], "own_kernels": own})
    return None


def _with_shape(rejection: Rejected, shape: Shape, hidden: bool) -> Rejected:
    evidence = dict(rejection.evidence)
    evidence.setdefault("shape", shape.as_dict())
    evidence.setdefault("hidden", hidden)
    return Rejected(rejection.status, rejection.reason, rejection.threat, evidence, rejection.shapes, rejection.environment)


def _failure_verdict(failure: WorkerFailure) -> Rejected:
    evidence = {"check": "sandbox", "failure": failure.kind.value, "diagnostics": failure.diagnostics.to_dict()}
    kind = failure.kind
    if kind is FailureKind.TIMEOUT:
        return Rejected(Status.TIMEOUT, f"the candidate did not finish in time: {failure.reason}", evidence=evidence)
    if kind is FailureKind.CRASHED:
        return Rejected(Status.CRASHED, f"the candidate's process crashed: {failure.reason}", evidence=evidence)
    if kind is FailureKind.EXITED_EARLY:
        return Rejected(Status.CRASHED, f"the candidate's process exited before finishing: {failure.reason}", evidence=evidence)
    if kind is FailureKind.PROTOCOL_VIOLATION:
        return Rejected(Status.CHEAT, f"the worker's channel carried something that is not a harness reply: {failure.reason}", threat=9, evidence=evidence)
    return Rejected(Status.SANDBOX_VIOLATION, f"the candidate exceeded its sandbox limits: {failure.reason}", threat=21, evidence=evidence)
