"""The judge's checks are pipelined (the candidate computes the next call while the reference
worker compares the last one); the pipeline must not change what is revealed or decided:

* hidden shapes are sent only once every public check passed, even with a call sent ahead;
* a rejection part-way leaves nothing behind in the reference worker;
* calls alternate between the two halves of the arena, and only references to the arena travel
  to the candidate: never a seed, never a value it could draw inputs from;
* each public shape's first call is repeated on the same inputs at other addresses.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import candidates as C
import pytest
from kernforge.loop.evaluate import open_judge
from kernforge.tasks.loader import load_task
from kernforge.verifier.gate import DeviceGate
from kernforge.verifier.judge import Judge, JudgeOptions

TASKS = Path(__file__).parent / "tasks"

#: Right on T=4 (the first public shape); from T=8 (the second) the last row is never written.
WRONG_ON_SECOND_PUBLIC = C.with_forward(
    "        return norm(x, w, rows=x.shape[0] if x.shape[0] == 4 else x.shape[0] - 1)")


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    options = JudgeOptions(cache_dir=tmp_path_factory.mktemp("cache"))
    with open_judge("cpu", pool_size=1, options=options) as j:
        yield j


@pytest.fixture
def sent(monkeypatch):
    """Every message the judge sent to the candidate's worker, in order."""
    seen: list[dict] = []
    original = Judge._send

    def recording(self, session, msg):
        seen.append(msg)
        return original(self, session, msg)

    monkeypatch.setattr(Judge, "_send", recording)
    return seen


@pytest.fixture
def asked(monkeypatch):
    """Every request the judge made of its reference worker, in order."""
    seen: list[dict] = []
    original = Judge._ask_ref

    def recording(self, reply_type, msg, **kw):
        seen.append(dict(msg))
        return original(self, reply_type, msg, **kw)

    monkeypatch.setattr(Judge, "_ask_ref", recording)
    return seen


def _last(asked):
    return [m["op"] for m in asked if m["op"] != "environment"][-1]


def _checks(sent):
    hidden = [s.as_dict() for s in load_task(TASKS / "tiny_norm").shapes("cpu", hidden=True)]
    return [(m["shape"], m["shape"] in hidden) for m in sent if m.get("op") == "check"]


def test_hidden_shapes_never_sent_after_a_public_failure(judge, sent, asked):
    verdict = judge.verify(WRONG_ON_SECOND_PUBLIC, load_task(TASKS / "tiny_norm"))
    assert not verdict.accepted
    assert "public shape T=8" in verdict.reason, verdict.reason
    checks = _checks(sent)
    assert checks and not any(hidden for _, hidden in checks), checks
    assert _last(asked) == "forget", "a rejection part-way leaves nothing in the reference worker"


def test_honest_kernel_checks_every_shape_in_order(judge, sent, asked):
    task = load_task(TASKS / "tiny_norm")
    verdict = judge.verify(C.HONEST, task)
    assert verdict.accepted, verdict.reason
    expected = []
    for hidden in (False, True):
        for s in task.shapes("cpu", hidden=hidden):
            for i, _ in enumerate(task.distributions):
                expected.append((s.as_dict(), hidden))
                if i == 0 and not hidden:
                    expected.append((s.as_dict(), hidden))  # the repeat
    assert _checks(sent) == expected
    assert verdict.environment["checked_calls"] == len(expected) == sum(m.get("op") == "check" for m in sent)
    phases = verdict.environment["phase_seconds"]
    for step in ("worker.check", "ref.prepare", "ref.compare", "ref.compare:snapshot", "checks public", "checks hidden"):
        assert step in phases and phases[step] >= 0, phases
    # each group's checks hold its compares
    assert phases["checks public"] + phases["checks hidden"] >= phases["ref.compare"], phases
    assert _last(asked) == "forget"


def test_only_arena_references_reach_the_candidate(judge, sent, asked):
    verdict = judge.verify(C.HONEST, load_task(TASKS / "tiny_norm"))
    assert verdict.accepted, verdict.reason
    checks = [m for m in sent if m.get("op") == "check"]
    assert checks and all("seed" not in m and "dist" not in m for m in checks)
    for m in checks:
        assert all(set(a) == {"ref"} for a in m["args"]), m["args"]
    prepared = [m for m in asked if m["op"] == "prepare"]
    assert all("seed" in m for m in prepared), "seeds go to the trusted side only"


def test_calls_alternate_halves_and_repeats_reuse_inputs(judge, asked):
    verdict = judge.verify(C.HONEST, load_task(TASKS / "tiny_norm"))
    assert verdict.accepted, verdict.reason
    prepared = [m for m in asked if m["op"] == "prepare"]
    parts = [m["part"] for m in prepared]
    assert all(a != b for a, b in itertools.pairwise(parts)), parts
    assert set(parts) == {0, 1}, "on the CPU two parts: nothing is deferred there"
    repeats = [m for m in prepared if m.get("repeat_of")]
    keys = {m["key"] for m in prepared}
    assert len(repeats) == 2 and all(r["repeat_of"] in keys for r in repeats)


def test_with_four_parts_the_calls_rotate_through_them(judge, asked, monkeypatch):
    """The layout a GPU gives an in-place task with room (late_reads.Deferral): the reference
    worker lays each call's inputs in its part, the judge hands the parts round in turn."""
    real = Judge._arena_layout

    def four_parts(self, *args, **kwargs):
        layout = real(self, *args, **kwargs)
        layout["size"] += layout["input_bytes"]
        layout["input_bytes"] *= 2
        return {**layout, "input_parts": 4}

    monkeypatch.setattr(Judge, "_arena_layout", four_parts)
    verdict = judge.verify(C.HONEST, load_task(TASKS / "tiny_norm"))
    assert verdict.accepted, verdict.reason
    parts = [m["part"] for m in asked if m["op"] == "prepare"]
    assert parts[:4] == [0, 1, 2, 3] and set(parts) == {0, 1, 2, 3}, parts
    assert [m for m in asked if m["op"] == "arena"][0]["input_parts"] == 4


def test_a_task_with_one_public_shape_repeats_its_first_call_twice(judge, asked, tmp_path):
    """Each repeat call is a sample of the worker's clock, and the clock rule accuses only on two
    (a KernelBench file has one public shape: one sample was a stall away from an accusation).
    Both repeat one kept call, forgotten after the second: a kept call holds its inputs, outputs
    and float64 references, tens of GB at KernelBench's sizes, and two did not fit on the H200."""
    folder = tmp_path / "one_shape"
    shutil.copytree(TASKS / "tiny_norm", folder)
    meta = folder / "meta.py"
    meta.write_text(meta.read_text().replace('PUBLIC_SHAPES = [{"T": 4, "H": 64}, {"T": 8, "H": 128}]',
                                             'PUBLIC_SHAPES = [{"T": 8, "H": 128}]'))
    verdict = judge.verify(C.HONEST, load_task(folder))
    assert verdict.accepted, verdict.reason
    prepared = [m for m in asked if m["op"] == "prepare"]
    repeats = [m for m in prepared if m.get("repeat_of")]
    assert len(repeats) == 2 and len({r["repeat_of"] for r in repeats}) == 1
    assert all(r["shape"] == {"T": 8, "H": 128} for r in repeats)
    drops = [m for m in asked if m["op"] == "drop"]
    assert [m["key"] for m in drops] == [repeats[0]["repeat_of"]], "forgotten once, after the last repeat"
    assert asked.index(drops[0]) > max(asked.index(r) for r in repeats)


@pytest.fixture(scope="module")
def serial_judge(tmp_path_factory):
    options = JudgeOptions(cache_dir=tmp_path_factory.mktemp("cache"), overlap_checks=False)
    with open_judge("cpu", pool_size=1, options=options) as j:
        yield j


@pytest.fixture
def events(monkeypatch):
    """The candidate's checked calls sent and the reference worker's requests, in one order."""
    seen: list[tuple[str, str]] = []
    send, ask = Judge._send, Judge._ask_ref

    def sending(self, session, msg):
        seen.append(("candidate", msg.get("op", "")))
        return send(self, session, msg)

    def asking(self, reply_type, msg, **kw):
        seen.append(("reference", msg["op"]))
        return ask(self, reply_type, msg, **kw)

    monkeypatch.setattr(Judge, "_send", sending)
    monkeypatch.setattr(Judge, "_ask_ref", asking)
    return seen


def test_serial_checks_send_each_call_once_the_last_is_compared(serial_judge, events):
    """overlap_checks=False (bench/verify.py --serial-checks): no checked call is in the
    candidate's hands while the reference worker compares another or prepares the next."""
    task = load_task(TASKS / "tiny_norm")
    verdict = serial_judge.verify(C.HONEST, task)
    assert verdict.accepted, verdict.reason
    ops = [op for who, op in events if who == "reference" or op == "check"]
    checks = [i for i, op in enumerate(ops) if op == "check"]
    assert len(checks) == sum(len(task.distributions) + (not hidden) for hidden in (False, True)
                              for _ in task.shapes("cpu", hidden=hidden))
    compares = [i for i, op in enumerate(ops) if op == "compare"]
    assert len(compares) == len(checks)
    for n, (sent, compared) in enumerate(zip(checks, compares)):
        assert sent < compared and (n + 1 == len(checks) or compared < checks[n + 1]), ops
        assert "prepare" not in ops[sent:compared], ops


def test_serial_checks_still_reject_at_the_failing_shape(serial_judge):
    verdict = serial_judge.verify(WRONG_ON_SECOND_PUBLIC, load_task(TASKS / "tiny_norm"))
    assert not verdict.accepted
    assert "public shape T=8" in verdict.reason, verdict.reason


# ---- time to a verdict is bounded by the task, not by the session's whole limit ----------------
HANGS_IN_FORWARD = C.HONEST.replace("def forward(self, x, w):", "def forward(self, x, w):\n        while True:\n            pass", 1)
HANGS_AT_IMPORT = "while True:\n    pass\n" + C.HONEST


@pytest.fixture(scope="module")
def judge_of_8_s(tmp_path_factory):
    """A judge whose first call at a shape and whose module load each get 8 s: both cases below."""
    options = JudgeOptions(cache_dir=tmp_path_factory.mktemp("cache"), first_call_timeout_cpu_s=8.0, load_timeout_s=8.0)
    with open_judge("cpu", pool_size=1, options=options) as judge:
        yield judge


@pytest.mark.parametrize("source, where", [(HANGS_IN_FORWARD, "checking"), (HANGS_AT_IMPORT, "loading the module")],
                         ids=["forward", "import"])
def test_a_hung_candidate_gets_a_timeout_verdict_from_the_tasks_own_limits(judge_of_8_s, source, where):
    assert source != C.HONEST
    judge = judge_of_8_s
    verdict = judge.verify(source, load_task(TASKS / "tiny_norm"))
    assert verdict.status.value == "timeout", verdict.reason
    assert "no answer within 8 s" in verdict.reason and where in verdict.reason
    honest = judge.verify(C.HONEST, load_task(TASKS / "tiny_norm"))  # the judge goes on working
    assert honest.accepted, honest.reason



def test_a_baseline_the_reference_cannot_run_leaves_the_verdict_its_times(tmp_path):
    """On the H200 a KernelBench softmax baseline ran out of memory: the candidate's own verdict
    must stand (flagged, no figures to compare with), and nothing is cached for next time."""
    from kernforge.tasks.spec import Shape
    from kernforge.verifier.cache import JsonCache
    from kernforge.verifier.judge import ReferenceFailed

    judge = Judge.__new__(Judge)
    judge.options = JudgeOptions(cache_dir=tmp_path)
    judge.baseline_cache = JsonCache(tmp_path / "baselines.json")
    judge.environment = lambda: {"gpu": "test", "driver": "0"}
    judge.gate, judge._phases = DeviceGate(1), {}
    asked = []

    def ask(reply_type, msg, **_):
        asked.append(msg["op"])
        raise ReferenceFailed("the task's reference failed on baseline: OutOfMemoryError: CUDA out of memory")

    judge._ask_ref = ask
    task = load_task(TASKS / "tiny_norm")
    got = judge._baseline(task, Shape.of({"T": 4, "H": 64}), 8, "default", 0)
    assert asked == ["compile_baseline", "baseline"] and "OutOfMemoryError" in got["baseline_error"]
    assert got.get("eager_us") is None and not (tmp_path / "baselines.json").exists()


def test_a_reference_worker_that_holds_memory_is_started_afresh(tmp_path, monkeypatch):
    """Once a verdict is over the reference worker gives its cached memory back; where it still
    holds more than the next task can spare (a graph's pool, pinned segments), the judge starts
    a fresh one, and the next verdict runs on it."""
    original = Judge._ask_ref
    holding = {"on": True}

    def forgetting(self, reply_type, msg, **kw):
        got = original(self, reply_type, msg, **kw)
        if msg["op"] == "forget" and holding["on"]:
            got = {**got, "restart": True}
        return got

    monkeypatch.setattr(Judge, "_ask_ref", forgetting)
    task = load_task(TASKS / "tiny_norm")
    with open_judge("cpu", pool_size=1, options=JudgeOptions(cache_dir=tmp_path)) as judge:
        judge.environment()  # asked once, kept: it never needs the worker again
        assert judge.verify(C.HONEST, task).accepted
        assert judge._ref is None, "the worker that held memory is gone"
        holding["on"] = False
        assert judge.verify(C.HONEST, task).accepted
        assert judge._ref is not None, "a worker that gave its memory back is kept"


def test_an_arena_the_reference_worker_cannot_make_is_said_at_once(tmp_path):
    """On the H200 a resumed KernelBench run made no verdict in eight minutes: the reference
    worker's arena failed, its error went to the message channel while the judge read the
    descriptor channel, for its whole message timeout. The error comes back as the answer, and
    the next verdict still runs."""
    from kernforge.verifier.judge import ReferenceFailed

    task = load_task(TASKS / "tiny_norm")
    with open_judge("cpu", pool_size=1, options=JudgeOptions(cache_dir=tmp_path, message_timeout_s=60)) as judge:
        with pytest.raises(ReferenceFailed, match="arena"):
            judge._ask_ref(None, {"op": "arena", "size": -1, "input_bytes": 0}, recv_fds=True)
        assert judge.verify(C.HONEST, task).accepted


def test_a_judges_environment_says_which_judge_and_how_it_judges(judge):
    """The code that judged (verifier/revision.py), the sandbox it found and its options: keyed
    with every verdict (archive/content.ENV_FIELDS), so a verdict made one way is never reused by
    a judge working another."""
    from kernforge.verifier import revision

    env = judge.environment()
    assert env["judge"] == revision.fingerprint() and env["sandbox"].startswith("process/")
    assert "screen=on" in env["judged_with"] and env["python"]

