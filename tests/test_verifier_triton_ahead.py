"""A candidate's Triton kernels compiled ahead at the public shapes (verifier/triton_ahead.py):
what the worker ahead is shown, what of its answer is kept, and that the verdict's worker finds
the files in its own Triton cache before the candidate is imported. On the CPU the interpreter
compiles nothing: a candidate stands in for Triton, writing a cache group where Triton would."""

from __future__ import annotations

import base64
import json

import pytest

from kernforge.sandbox.protocol import FailureKind, WorkerFailure
from kernforge.tasks.loader import load_task
from kernforge.verifier import triton_ahead
from kernforge.verifier.verdict import Accepted

BUILTIN = ["fp8_quant_per_group", "fp8_quant_per_token", "fused_add_rms_norm", "fused_moe", "gemm_small_m",
           "merge_attn_states", "moe_topk_softmax", "paged_decode_attention", "reshape_and_cache", "rms_norm",
           "rms_norm_fp8_quant", "rotary_embedding", "silu_and_mul", "softmax"]

#: the rms_norm seed, its forward on meta tensors (the worker ahead) writing a Triton cache group
#: named by the call's shape, and a file of every shape it was called at
WRITES_A_GROUP = """
import json as _json
import os as _os

_Seed = ModelNew


class ModelNew(_Seed):
    def forward(self, x, weight):
        if x.device.type == "meta":
            root = _os.environ["TRITON_CACHE_DIR"]
            folder = _os.path.join(root, "k%dx%d" % tuple(x.shape))
            _os.makedirs(folder, exist_ok=True)
            with open(_os.path.join(folder, "kernel.cubin"), "wb") as f:
                f.write(bytes(range(7)))
            with open(_os.path.join(folder, "__grp__kernel.json"), "w") as f:
                f.write(_json.dumps({"child_paths": {"kernel.cubin": _os.path.join(folder, "kernel.cubin")}}))
            return x
        return super().forward(x, weight)
"""

#: the rms_norm seed, refusing to load unless the groups compiled ahead are in its own Triton
#: cache, every member where its group says
NEEDS_THE_GROUPS = """
import json as _json
import os as _os

for _shape in {shapes!r}:
    _folder = _os.path.join(_os.environ["TRITON_CACHE_DIR"], _shape)
    with open(_os.path.join(_folder, "__grp__kernel.json")) as _f:
        _paths = _json.load(_f)["child_paths"]
    assert _paths == {{"kernel.cubin": _os.path.join(_folder, "kernel.cubin")}}, _paths
    with open(_paths["kernel.cubin"], "rb") as _f:
        assert _f.read() == bytes(range(7))
"""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@pytest.mark.parametrize("name", BUILTIN)
def test_every_public_shape_of_a_builtin_task_is_described_for_meta_tensors(name):
    task = load_task(name)
    described = triton_ahead.calls(task)
    assert [c["shape"] for c in described] == [s.as_dict() for s in task.shapes("cuda", hidden=False)]
    for call in described:
        for arg in call["args"]:
            assert set(arg) in ({"meta"}, {"value"})
            if "meta" in arg:
                assert len(arg["meta"]["shape"]) == len(arg["meta"]["strides"]) and arg["meta"]["dtype"]


def test_a_kernelbench_problem_is_described_from_its_get_inputs():
    from pathlib import Path

    problem = Path(__file__).resolve().parent.parent / "bench" / "kernelbench" / "problems" / "level1" / "19_ReLU.py"
    task = load_task(str(problem))
    described = triton_ahead.calls(task)
    assert len(described) == len(task.shapes("cuda", hidden=False)) >= 1
    assert all("meta" in a for c in described for a in c["args"])


def test_only_a_triton_cache_layout_within_the_caps_is_accepted():
    good = {"abc123/__grp__k.json": _b64(b"{}"), "abc123/k.cubin": _b64(b"\x00\x01")}
    assert triton_ahead.accepted(good) == good
    for bad in ({"../k.cubin": _b64(b"x")}, {"abc/../../k": _b64(b"x")}, {"/abs/k.cubin": _b64(b"x")},
                {"a/b/c": _b64(b"x")}, {"k.cubin": _b64(b"x")}, {"abc/..": _b64(b"x")}, {"abc/k": "not base64!"},
                {"abc/k": 7}, {"abc/k": _b64(b"x" * (triton_ahead.MAX_BYTES + 1))}, ["abc/k"], None):
        assert triton_ahead.accepted(bad) == {}, bad
    many = {f"k/{i}": _b64(b"x") for i in range(triton_ahead.MAX_FILES + 1)}
    assert triton_ahead.accepted(many) == {}


def test_a_cuda_cpp_source_is_not_compiled_ahead_and_a_cpu_judge_compiles_nothing(cpu_judge):
    task = load_task("rms_norm")
    assert not triton_ahead.wanted("from torch.utils.cpp_extension import load_inline\n")
    assert triton_ahead.wanted(task.seed_source)
    assert cpu_judge.kernels_ahead(task.seed_source, task) is None


def test_the_worker_ahead_is_called_at_the_public_shapes_only_and_its_groups_reach_the_verdicts_worker(cpu_runtime_judge,
                                                                                                       monkeypatch):
    monkeypatch.setattr(triton_ahead, "READY_WAIT_S", 300.0)  # a busy CI core warms a worker slowly
    task = load_task("rms_norm")
    source = task.seed_source + WRITES_A_GROUP
    ahead = triton_ahead.Ahead(cpu_runtime_judge.candidates, cpu_runtime_judge.gate, source, task, "cpu", spare=0, decoys=0)
    files = ahead.run()
    public = {_group(s) for s in task.shapes("cuda", hidden=False)}
    assert ahead.shapes == len(public)
    assert {name.split("/")[0] for name in files} == public  # never a hidden shape
    assert set(files) == {f"{k}/{leaf}" for k in public for leaf in ("kernel.cubin", "__grp__kernel.json")}

    checking = task.seed_source + NEEDS_THE_GROUPS.format(shapes=sorted(public))
    verdict = cpu_runtime_judge.verify(checking, task, compiled=files)
    assert isinstance(verdict, Accepted), verdict.reason
    refused = cpu_runtime_judge.verify(checking, task)  # without them it cannot load: the test can fail
    assert not isinstance(refused, Accepted)
    assert "AssertionError" in refused.reason or "FileNotFoundError" in refused.reason, refused.reason


def _group(shape):
    return "k%dx%d" % (shape.as_dict()["T"], shape.as_dict()["H"])


def test_after_the_public_shapes_the_worker_ahead_compiles_at_decoys_drawn_anew_never_at_a_hidden_shape(cpu_runtime_judge,
                                                                                                         monkeypatch):
    """The decoys' files come in an answer of their own and join the public shapes'; the decoys
    are drawn for each compile ahead (two differ), from the task's space, and none is one of the
    shapes a verdict checks by name (the fixed hidden ones)."""
    monkeypatch.setattr(triton_ahead, "READY_WAIT_S", 300.0)
    task = load_task("rms_norm")
    public = {_group(s) for s in task.shapes("cuda", hidden=False)}
    hidden = {_group(s) for s in task.shapes("cuda", hidden=True)}
    groups = []
    for _ in range(2):
        ahead = triton_ahead.Ahead(cpu_runtime_judge.candidates, cpu_runtime_judge.gate, task.seed_source + WRITES_A_GROUP,
                                   task, "cpu", spare=0, decoys=4)
        files = ahead.run()
        assert ahead.outcome == "compiled" and ahead.shapes == len(public) and ahead.decoys == 4, ahead.outcome
        made = {name.split("/")[0] for name in files}
        assert public < made and len(made - public) == 4 and not made & hidden
        assert set(files) == {f"{k}/{leaf}" for k in made for leaf in ("kernel.cubin", "__grp__kernel.json")}
        groups.append(made - public)
    assert groups[0] != groups[1], "drawn anew for each compile ahead"


def test_the_decoys_compile_nicer_than_the_public_shapes_a_verdict_may_wait_for(cpu_runtime_judge, monkeypatch):
    """Each compile writes the nice value it ran at as its kernel: the public shapes' at the
    worker's own, every decoy's ``DECOY_NICE`` more (the host's cores go to the verdicts first)."""
    from kernforge.verifier import triton_ahead_worker

    monkeypatch.setattr(triton_ahead, "READY_WAIT_S", 300.0)
    task = load_task("rms_norm")
    public = {_group(s) for s in task.shapes("cuda", hidden=False)}
    says_its_nice = WRITES_A_GROUP.replace("bytes(range(7))", "bytes([_os.getpriority(_os.PRIO_PROCESS, 0)])")
    ahead = triton_ahead.Ahead(cpu_runtime_judge.candidates, cpu_runtime_judge.gate, task.seed_source + says_its_nice,
                               task, "cpu", spare=0, decoys=2)
    files = ahead.run()
    assert ahead.outcome == "compiled" and ahead.decoys == 2, ahead.outcome
    nice = {name.split("/")[0]: base64.b64decode(data)[0] for name, data in files.items() if name.endswith(".cubin")}
    at_public = {nice[k] for k in public}
    assert len(at_public) == 1 and len(nice) == len(public) + 2, nice
    own = at_public.pop()
    assert {v for k, v in nice.items() if k not in public} == {min(own + triton_ahead_worker.DECOY_NICE, 19)}, nice


#: the rms_norm seed whose forward on meta tensors, at its second shape that is not a public one
#: (the second decoy), waits until it is killed
STALLS_AT_THE_SECOND_DECOY = WRITES_A_GROUP.replace("            return x\n", """            if tuple(x.shape) not in PUBLIC:
                if _os.path.exists("one-decoy-made"):
                    import time as _time
                    _time.sleep(600)
                open("one-decoy-made", "w").close()
            return x
""")


def test_a_verdict_that_begins_during_the_decoys_keeps_the_files_that_came_and_ends_the_rest(monkeypatch):
    """The loop's wait for a compile ahead (KernelsAhead.files) waits for the public shapes'
    answer only: the decoys' compiles still running are ended then, and the files of the public
    shapes and of each decoy whose answer came are kept."""
    import asyncio

    from kernforge.loop.evaluate import open_judge
    from kernforge.loop.kernels_ahead import KernelsAhead

    monkeypatch.setattr(triton_ahead, "READY_WAIT_S", 300.0)
    task = load_task("rms_norm")
    public = sorted(tuple(s.as_dict()[k] for k in ("T", "H")) for s in task.shapes("cuda", hidden=False))
    with open_judge("cpu", pool_size=1) as judge:
        source = task.seed_source + f"PUBLIC = {set(public)!r}\n" + STALLS_AT_THE_SECOND_DECOY
        ahead = triton_ahead.Ahead(judge.candidates, judge.gate, source, task, "cpu", spare=0, decoys=3)

        async def verdict_begins():
            running = asyncio.create_task(asyncio.to_thread(ahead.run))
            while ahead.decoys < 1 and not running.done():  # the first decoy's answer is in
                await asyncio.sleep(0.05)
            kernels = KernelsAhead(ahead, running)
            return await kernels.files(), kernels.outcome

        files, outcome = asyncio.run(verdict_begins())
    made = {name.split("/")[0] for name in files}
    assert {"k%dx%d" % p for p in public} < made and len(made) == len(public) + 1, made
    assert outcome == "compiled; decoys cut short", outcome
    assert ahead.decoys == 1


def _staged():
    """A compile ahead's ``staged`` event, set: its public shapes' files are in."""
    import threading

    event = threading.Event()
    event.set()
    return event


class _Answers:
    """A worker ahead's session that answers from a list (``_with_decoys``' side of it), then
    fails as a worker ended by a verdict's ``cancel`` does."""

    def __init__(self, *answers):
        self.answers = list(answers)

    def recv(self, timeout):
        if not self.answers:
            raise WorkerFailure(FailureKind.CRASHED, "killed")
        return self.answers.pop(0)


def test_a_decoys_answer_is_taken_only_whole_and_within_the_caps_beside_the_public_files(monkeypatch):
    ahead = triton_ahead.Ahead(None, None, "", load_task("rms_norm"), "cuda:0")
    ahead.outcome = "compiled"
    public = {"a/kernel.cubin": _b64(b"1"), "a/__grp__kernel.json": _b64(b"{}")}
    decoy = {"b/kernel.cubin": _b64(b"2"), "b/__grp__kernel.json": _b64(b"{}")}

    def answer(files, **extra):
        return {"op": "ahead", "ok": True, "stage": "decoys", "shapes": 2, "files": files, "last": True, **extra}

    assert ahead._with_decoys(_Answers(answer(decoy)), public, 5.0) == {**public, **decoy}
    assert ahead.decoys == 2 and ahead.outcome == "compiled"
    for bad, why in [(answer({"a/kernel.cubin": _b64(b"3")}), "a malformed answer from the decoys"),  # over a public file
                     (answer({"b/cuda_utils.so": _b64(b"\x7fELF")}), "a malformed answer from the decoys"),
                     ({**answer(decoy), "stage": "public"}, "no answer from the decoys"),
                     ("nonsense", "no answer from the decoys")]:
        ahead.outcome = "compiled"
        assert ahead._with_decoys(_Answers(bad), public, 5.0) == public
        assert ahead.outcome == f"compiled; {why}", ahead.outcome
    monkeypatch.setattr(triton_ahead, "MAX_FILES", 3)  # the two answers together over the caps: the public files alone
    ahead.outcome = "compiled"
    assert ahead._with_decoys(_Answers(answer(decoy)), public, 5.0) == public


def test_each_decoys_answer_joins_the_files_until_the_last_or_one_amiss():
    ahead = triton_ahead.Ahead(None, None, "", load_task("rms_norm"), "cuda:0", decoys=4)
    public = {"a/kernel.cubin": _b64(b"1"), "a/__grp__kernel.json": _b64(b"{}")}
    group = {k: {f"{k}/kernel.cubin": _b64(k.encode()), f"{k}/__grp__kernel.json": _b64(b"{}")} for k in "bcd"}

    def answer(files, last=False):
        return {"op": "ahead", "ok": True, "stage": "decoys", "shapes": 1, "files": files, "last": last}

    def run(*answers):
        ahead.outcome, ahead.decoys = "compiled", 0
        return ahead._with_decoys(_Answers(*answers), public, 5.0)

    assert run(answer(group["b"]), answer({}), answer(group["c"], last=True), answer(group["d"])) == \
        {**public, **group["b"], **group["c"]}, "nothing after the last"
    assert ahead.decoys == 3 and ahead.outcome == "compiled"
    assert run(answer(group["b"]), answer(group["c"])) == {**public, **group["b"], **group["c"]}, "ended before the last"
    assert ahead.outcome == "compiled; no answer from the decoys"
    assert run(answer(group["b"]), answer(group["b"]), answer(group["c"], last=True)) == {**public, **group["b"]}, \
        "a name twice ends it, keeping what came before"
    assert ahead.outcome == "compiled; a malformed answer from the decoys" and ahead.decoys == 1


def test_a_candidate_that_fails_ahead_gives_no_files(monkeypatch):
    from kernforge.loop.evaluate import open_judge

    monkeypatch.setattr(triton_ahead, "READY_WAIT_S", 300.0)
    task = load_task("rms_norm")
    with open_judge("cpu", pool_size=1) as judge:
        outcomes = []

        def ahead(source):
            made = triton_ahead.Ahead(judge.candidates, judge.gate, source, task, "cpu", spare=0)
            files = made.run()
            outcomes.append(made.outcome)
            return files

        assert ahead(task.seed_source + WRITES_A_GROUP)  # the same judge's worker gives files where they are made
        assert outcomes[-1] == "compiled"
        for source in ("raise SystemExit(3)\n", "import nothing_of_the_sort\n", task.seed_source + "\nraise RuntimeError('late')\n",
                       task.seed_source + WRITES_A_GROUP + "\nimport os\nos._exit(0)\n"):
            assert ahead(source) == {}, source[-40:]
            assert outcomes[-1].startswith(("its worker failed", "no answer")), outcomes[-1]
        # a call that fails on meta tensors: the shapes that worked still give their files, and the log says why not all
        fails_once = WRITES_A_GROUP.replace("if x.device.type == \"meta\":", "if x.device.type == \"meta\" and x.shape[0] == 1:\n"
                                            "            raise NotImplementedError('no meta kernel')\n        if x.device.type == \"meta\":")
        assert ahead(task.seed_source + fails_once)
        assert outcomes[-1] == "a call failed: NotImplementedError: no meta kernel", outcomes[-1]


LAUNCHER = "__triton_launcher.cpython-312-x86_64-linux-gnu.so"


def test_no_shared_object_but_a_kernels_launcher_alone_under_its_key_is_carried():
    for name in ("abc/cuda_utils.so", "abc/k.py", "abc/k.c", "abc/k", "abc/launcher.so", "abc/__triton_launcher.so.1",
                 "abc/x__triton_launcher.so", "../__triton_launcher.so"):
        assert triton_ahead.accepted({name: _b64(b"\x7fELF")}) == {}, name
    for name in ("abc/__triton_launcher.so", f"abc/{LAUNCHER}"):
        assert triton_ahead.accepted({name: _b64(b"\x7fELF")}) == {name: _b64(b"\x7fELF")}, name
    # a launcher beside a kernel's files, or beside another launcher, is no key Triton wrote: nothing is taken
    assert triton_ahead.accepted({"abc/k.cubin": _b64(b"bin"), f"abc/{LAUNCHER}": _b64(b"elf")}) == {}
    assert triton_ahead.accepted({"abc/__triton_launcher.so": _b64(b"elf"), f"abc/{LAUNCHER}": _b64(b"elf")}) == {}
    kept = {"k1/k.cubin": _b64(b"bin"), "k1/__grp__k.json": _b64(b"{}"), f"l1/{LAUNCHER}": _b64(b"elf")}
    assert triton_ahead.accepted(kept) == kept


def test_the_worker_ahead_carries_only_the_kernels_and_launchers_its_calls_made(tmp_path):
    from kernforge.verifier.triton_ahead_worker import cache_files

    for key, names in {"warm": ["__grp__w.json", "w.cubin"], "warmlauncher": [LAUNCHER], "launcher": [LAUNCHER],
                       "utils": ["cuda_utils.cpython-312-x86_64-linux-gnu.so"], "twolaunchers": [LAUNCHER, "__triton_launcher.so"],
                       "mixed": ["__grp__m.json", "m.cubin", "m.so"], "kernel": ["__grp__k.json", "k.cubin", "k.ptx"]}.items():
        (tmp_path / key).mkdir()
        for n in names:
            (tmp_path / key / n).write_bytes(b"x")
    files = cache_files(str(tmp_path), 1 << 20, 100, before={"warm", "warmlauncher"})
    assert set(files) == {"kernel/__grp__k.json", "kernel/k.cubin", "kernel/k.ptx", f"launcher/{LAUNCHER}"}


def test_an_autotuners_pick_made_ahead_is_never_carried(tmp_path):
    """The worker ahead compiles every config of an autotuned kernel and times them all alike, so
    where the kernel asks Triton to keep its pick (``cache_results``), the pick written is the
    first config. Carried to the verdict's worker, it would be timed instead of the fastest: an
    honest kernel made slower. The worker ahead leaves it out, and the judge takes no answer with it."""
    from kernforge.verifier.triton_ahead_worker import cache_files

    for key, names in {"kernel": ["__grp__k.json", "k.cubin"], "tuned": ["k.autotune.json"]}.items():
        (tmp_path / key).mkdir()
        for n in names:
            (tmp_path / key / n).write_bytes(b"{}")
    assert set(cache_files(str(tmp_path), 1 << 20, 100)) == {"kernel/__grp__k.json", "kernel/k.cubin"}
    assert triton_ahead.accepted({"tuned/k.autotune.json": _b64(b"{}")}) == {}
    assert triton_ahead.accepted({"kernel/k.cubin": _b64(b"bin"), "tuned/k.autotune.json": _b64(b"{}")}) == {}


def test_the_worker_ahead_builds_each_kernels_launcher_once_and_a_failure_costs_nothing(monkeypatch):
    """Triton's warm-up compiles a kernel and builds no launcher: the worker ahead builds it, as
    the kernel's first launch in the verdict would have (Triton 3.6: a C compile per signature)."""
    from types import SimpleNamespace

    from triton.runtime import driver

    from kernforge.verifier.triton_warmup import build_launcher

    made = []

    def launcher_cls(src, metadata):
        made.append((src, metadata))
        if src == "bad":
            raise RuntimeError("no compiler")

    monkeypatch.setattr(driver, "_active", SimpleNamespace(launcher_cls=launcher_cls), raising=False)
    monkeypatch.setattr(type(driver), "active", property(lambda self: self._active), raising=False)
    built: set[str] = set()
    k1 = SimpleNamespace(hash="h1", src="s1", metadata="m1")
    for kernel in (k1, k1, SimpleNamespace(hash="h2", src="bad", metadata="m2"), None, SimpleNamespace(src="s3", metadata="m3")):
        build_launcher(kernel, built)
    assert made == [("s1", "m1"), ("bad", "m2")] and built == {"h1", "h2"}


def test_the_verdicts_worker_writes_no_file_over_one_its_cache_has(tmp_path, monkeypatch):
    from kernforge.verifier import harness

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    (tmp_path / "loaded").mkdir()
    (tmp_path / "loaded" / "mod.json").write_bytes(b"mine")
    (tmp_path / "warm").mkdir()
    (tmp_path / "warm" / LAUNCHER).write_bytes(b"mine")
    group = json.dumps({"child_paths": {"k.cubin": "/elsewhere/new/k.cubin"}}).encode()
    harness._kernels_ahead({"loaded/mod.json": _b64(b"theirs"), "loaded/k.cubin": _b64(b"theirs"),
                            "new/__grp__k.json": _b64(group), "new/k.cubin": _b64(b"bin"), "new/k.so": _b64(b"elf"),
                            f"warm/{LAUNCHER}": _b64(b"theirs"), f"fresh/{LAUNCHER}": _b64(b"elf")})
    assert (tmp_path / "loaded" / "mod.json").read_bytes() == b"mine"
    assert sorted(p.name for p in (tmp_path / "loaded").iterdir()) == ["mod.json"]
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["__grp__k.json", "k.cubin"]
    assert (tmp_path / "warm" / LAUNCHER).read_bytes() == b"mine", "a loaded launcher is never written over"
    assert (tmp_path / "fresh" / LAUNCHER).read_bytes() == b"elf"
    assert json.loads((tmp_path / "new" / "__grp__k.json").read_text())["child_paths"] == {"k.cubin": str(tmp_path / "new" / "k.cubin")}


def test_a_group_naming_anything_but_a_kernels_file_is_not_written(tmp_path, monkeypatch):
    from kernforge.verifier import harness

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    for key, member in (("up", "/x/.."), ("lib", "/x/launcher.so"), ("odd", "/x/k.cubin")):
        group = {"child_paths": {"k.cubin": member}} if key != "odd" else {"child_paths": ["k.cubin"]}
        harness._kernels_ahead({f"{key}/__grp__k.json": _b64(json.dumps(group).encode()), f"{key}/k.cubin": _b64(b"bin")})
        assert not (tmp_path / key / "__grp__k.json").exists(), key  # its kernel compiles when launched


@pytest.mark.parametrize("without", ["incorrect", "crashed"])
def test_a_verdict_that_crashed_with_its_kernels_ahead_is_made_again_without_and_none_is_compiled_ahead_after(without):
    import asyncio

    from kernforge.loop.devices import AHEAD_SUSPECT, Devices
    from kernforge.loop.kernels_ahead import KernelsAhead
    from kernforge.verifier.verdict import Rejected, Status

    task = load_task("rms_norm")
    judged = []

    class Judge:
        def verify(self, code, task, bar=None, audit=False, compiled=None):
            judged.append(bool(compiled))
            if compiled:
                return Rejected(Status.CRASHED, "the worker was killed by SIGSEGV", None, {}, [], {})
            return Rejected(Status(without), "a failure of its own", None, {}, [], {})

        def kernels_ahead(self, code, task):
            raise AssertionError("compiled ahead after a crash")

    class Done:  # a compile ahead that gave its files
        source, shapes, decoys, outcome, pool = task.seed_source, 4, 0, "compiled", None
        staged = _staged()

        def run(self):
            return {"k/__grp__x.json": _b64(b"{}")}

        def cancel(self):
            pass

    async def go():
        devices = Devices(["cuda:0"], sandbox="process")
        devices.judges = [Judge()]
        ahead = KernelsAhead(Done(), asyncio.create_task(asyncio.to_thread(Done().run)))
        verdict, _ = await devices.verify(0, task.seed_source, task, None, ahead)
        return devices, verdict

    devices, verdict = asyncio.run(go())
    assert judged == [True, False]  # judged again, without the files: that verdict stands
    assert Status.TIMEOUT not in AHEAD_SUSPECT  # a slow candidate's time box is not spent twice
    assert verdict.status is Status(without) and verdict.reason == "a failure of its own"
    if without == "crashed":  # it crashes either way: the files were not why, and they stay in use
        assert devices.ahead_off is None
    else:
        assert "SIGSEGV" in devices.ahead_off
        assert devices.kernels_ahead(task.seed_source, task) is None


def test_a_compile_ahead_takes_a_worker_only_while_the_pool_has_one_to_spare(monkeypatch):
    from kernforge.verifier.gate import DeviceGate

    monkeypatch.setattr(triton_ahead, "READY_WAIT_S", 0.2)
    task = load_task("rms_norm")

    class Pool:
        def __init__(self, ready):
            self.ready, self.sessions = ready, 0

        def counts(self):
            return {"ready": self.ready}

        def session(self, entry, payload, limits):
            self.sessions += 1
            raise triton_ahead.SandboxError("no worker for this test")

    short, spare = Pool(1), Pool(2)
    none_spare = triton_ahead.Ahead(short, DeviceGate(), task.seed_source, task, "cuda:0")
    assert none_spare.run() == {}
    assert short.sessions == 0  # the verdicts' warm worker was left alone, the gate never held
    assert none_spare.pool == {"ready": 1}, "the pool as it was, for the run's log"
    spared = triton_ahead.Ahead(spare, DeviceGate(), task.seed_source, task, "cuda:0")
    assert spared.run() == {}
    assert spare.sessions == 1 and spared.pool is None


def test_the_loop_bench_says_what_the_compiles_ahead_came_to():
    from bench_helpers import bench_script

    line = bench_script("loop").ahead_line
    assert line([{"kind": "verdict", "status": "accepted"}]) == "kernels compiled ahead: none"
    log = [{"kind": "verdict", "status": "crashed", "ahead": {"shapes": 4, "files": 26}, "steps": {"ahead.wait": 0.2}},
           {"kind": "verdict", "status": "accepted", "ahead": {"shapes": 0, "files": 0, "outcome": "no warm worker to spare"},
            "steps": {"ahead.wait": 0.0}},
           {"kind": "audit", "status": "accepted"}]
    assert line(log) == ("kernels compiled ahead: 1 of 2 verdicts got files (1 crashed, 1 accepted); 0.10 s waited for them "
                         "a verdict; none for 1 (no warm worker to spare)")
    log[0]["ahead"]["decoys"] = 5  # five decoys' answers came before the verdict began
    assert "a verdict; 1 with decoys' (2.5 decoys a verdict); none for 1" in line(log)
    log += [{"kind": "audit", "status": "accepted", "ahead": {"files": 26}}, {"kind": "audit", "status": "accepted", "ahead": {"files": 0}}]
    assert line(log).endswith("; 1 of 2 audits were given their verdict's")
    log[1]["ahead"]["pool"] = {"ready": 1, "starting": 3, "busy": 2, "started": 9, "start_ms": 7400}
    assert ("none for 1 (no warm worker to spare) (the pool then: 1.0 ready, 3.0 starting; a worker's start 7.4 s); "
            "1 of 2 audits") in line(log)
    log[1]["ahead"]["pool"]["start_steps"] = {"preload": 2.5, "imports": 0.4, "triton_launch": 3.25}  # the workers' own account
    assert "a worker's start 7.4 s (preload 2.5, imports 0.4, triton_launch 3.2))" in line(log)


@pytest.mark.parametrize("audit_without", ["accepted", "crashed"])
def test_an_audit_is_given_its_verdicts_kernels_compiled_ahead_and_made_again_without_where_it_crashed(audit_without):
    """An accepted verdict's files go to its audit (the second verdict's worker and the profiled
    one), once; an audit that crashed with them is made again without, and that one stands."""
    import asyncio

    from kernforge.loop.devices import Devices
    from kernforge.loop.kernels_ahead import KernelsAhead
    from kernforge.verifier.verdict import Rejected, ShapeResult, Status

    task = load_task("rms_norm")
    files = {"k/__grp__x.json": _b64(b"{}")}
    timed = (ShapeResult({"T": 4}, False, "bfloat16", "graph", time_us=5.0),)
    given = []

    class Judge:
        def verify(self, code, task, bar=None, audit=False, compiled=None):
            given.append(("audit" if audit else "verdict", compiled))
            if audit and compiled:
                return Rejected(Status.CRASHED, "the worker was killed by SIGSEGV", None, {}, [], {})
            if audit and audit_without == "crashed":
                return Rejected(Status.CRASHED, "it crashes anyway", None, {}, [], {})
            return Accepted(timed)

        def kernels_ahead(self, code, task):
            return None

    class Done:
        source, shapes, decoys, outcome, pool = task.seed_source, 4, 0, "compiled", None
        staged = _staged()

        def run(self):
            return files

        def cancel(self):
            pass

    async def go():
        devices = Devices(["cuda:0"], sandbox="process")
        devices.judges = [Judge()]
        verdict, _ = await devices.verify(0, task.seed_source, task, None, KernelsAhead(Done(), asyncio.create_task(
            asyncio.to_thread(Done().run))))
        first, _ = await devices.audit(0, task.seed_source, task, verdict)
        again, _ = await devices.audit(0, task.seed_source, task, verdict)
        return devices, first, again

    devices, first, again = asyncio.run(go())
    assert given[:3] == [("verdict", files), ("audit", files), ("audit", None)], "made again without the files"
    assert given[3:] == [("audit", None)], "the files go to one audit: the next is given none"
    assert first.passed is (audit_without == "accepted") and first.verdict.status is Status(audit_without)
    if audit_without == "accepted":
        assert "SIGSEGV" in devices.ahead_off
    else:
        assert devices.ahead_off is None


def test_a_drawer_that_fails_costs_the_decoys_only(monkeypatch):
    from kernforge.tasks import draws

    task = load_task("rms_norm")
    assert len(triton_ahead.decoy_calls(task, 3)) == 3

    def broken(*args, **kwargs):
        raise RuntimeError("a drawer of the task's own that fails")

    monkeypatch.setattr(draws, "draw", broken)
    assert triton_ahead.decoy_calls(task, 3) == []
    assert triton_ahead.calls(task), "the public shapes are still described"
