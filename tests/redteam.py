"""The red-team corpus against the trusted judge: candidates that attack what the candidate's own
process produces, by class (the issue's list), and honest kernels that look unusual.

Each attack is written against this judge's design, not only the old one: it goes after the
facts a verdict could rest on (the worker's clock, its reply, its signals, the batch's "done",
the places of its outputs) and names the verdict it must get. ``where`` says where it runs:
"cpu" (the Triton interpreter), "gpu", or "both".

Some attacks only hide torch compute from the worker's own trace (they rewrite the trace and the
integrity check together). No trusted observer can tell torch compute from an interpreted
kernel on the CPU, whose verdicts are correctness only; on a GPU the audit of a winner runs it
under Nsight Compute, which lists the kernels that really ran. ``cpu_limit`` marks them: on the
CPU they are accepted (correctly: their outputs are right), and the GPU test shows the audit
catching them.
"""

from __future__ import annotations

from dataclasses import dataclass

from candidates import KERNEL, with_forward

#: torch doing the rms-norm, as a cheat would (compute ops: the trace's business)
TORCH_NORM = "(x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)"

#: the integrity module and the harness, reached through aliases the static screen does not resolve
ALIASES = '''
import torch
_MODS = getattr(torch, "sy" + "s").modules
_I = _MODS["kernforge.verifier." + "integrity"]
_H = _MODS["kernforge.verifier." + "harness"]
'''

#: what every attack that wants its signals unseen adds: the integrity check always says "clean"
SCRUB_INTEGRITY = '''
setattr(_I, "tamp" + "ered", lambda before: [])
'''


#: the first lines of a forward whose only tell is a clock that lies (the worker's time of a
#: checked call divided): on the CPU each call lasts 20 ms at least, so the trusted clock's samples
#: (the repeat calls) are long enough to tell a lie from their 5 ms margin (clock.lied counts only
#: samples of twice the margin). Without it an idle machine ran tiny_norm's repeat calls in 9 ms:
#: one telling sample, fewer than the rule asks, and the attack was accepted (a lie it cannot tell
#: gains nothing: the interpreter's times rank nothing, and a GPU's time of record is trusted).
LONG_ENOUGH_TO_TELL = "if x.device.type == 'cpu':\n    __import__('time').sleep(0.02)\n"


#: the harness's signal report, rewritten through an alias to drop the op trace
HIDE_TORCH_OPS = '''
_sig = getattr(_H, "_sig" + "nals")
def _quiet(**kw):
    out = _sig(**kw)
    out["torch_ops"] = {}
    return out
setattr(_H, "_sig" + "nals", _quiet)
'''


@dataclass(frozen=True)
class Attack:
    name: str
    klass: int  # the class (1-8), or 9 for attacks beyond its list
    source: str
    #: (status, threat) the judge must give; ("accepted", None) for honest kernels
    expect: tuple[str, int | None]
    where: str = "both"
    #: accepted on the CPU (correctness only); the GPU audit rejects it with ``expect``
    cpu_limit: bool = False
    #: other (status, threat) pairs that are equally right (a race decides which check fires first)
    also: tuple[tuple[str, int | None], ...] = ()
    task: str = "tiny_norm"


def _fwd(body: str, prelude: str = "") -> str:
    return with_forward("        " + body.replace("\n", "\n        "), prelude)


def _on_send(rewrite: str, body: str = "return norm(x, w)", prelude: str = "") -> str:
    """An attack that replaces the worker's reply channel on its first call: every message goes
    out through ``rewrite(m)``, whose body is given (it returns the message to send)."""
    lines = "\n".join("        " + ln for ln in rewrite.strip("\n").splitlines())
    install = ALIASES + prelude + f"""
_INSTALLED = []
def _install():
    ch = _H._STATE["channel"]
    send = ch.send
    def rewrite(m):
{lines}
    ch.send = lambda m: send(rewrite(m))
"""
    return _fwd(f"if not _INSTALLED:\n    _install()\n    _INSTALLED.append(1)\n{body}", install)


ATTACKS = [
    # ---- 1: rebinding the harness, the timer or the integrity check through aliases ----------
    Attack("alias_divides_the_clock", 1, _fwd("return norm(x, w)", ALIASES + '''
_real = getattr(_I, "perf_" + "counter")
setattr(_I, "perf_" + "counter", lambda: _real() / 8)
'''), ("cheat", 8)),
    Attack("alias_divides_the_clock_and_scrubs", 1, _fwd(LONG_ENOUGH_TO_TELL + "return norm(x, w)", ALIASES + SCRUB_INTEGRITY + '''
_real = getattr(_I, "perf_" + "counter")
setattr(_I, "perf_" + "counter", lambda: _real() / 8)
'''), ("cheat", 8)),
    Attack("alias_hides_torch_ops", 1, _fwd(f"return {TORCH_NORM}", ALIASES + HIDE_TORCH_OPS), ("cheat", 10)),
    Attack("alias_hides_torch_ops_and_scrubs", 1, _fwd(f"return {TORCH_NORM}", ALIASES + SCRUB_INTEGRITY + HIDE_TORCH_OPS), ("cheat", 16), also=(("cheat", 17),)),
    Attack("decoy_launch_hides_torch_compute", 1, _fwd(f"norm(x[:1], w)  # a decoy launch: its result is thrown away\nreturn {TORCH_NORM}", ALIASES + SCRUB_INTEGRITY + HIDE_TORCH_OPS), ("cheat", 16)),
    Attack("alias_no_sync_before_done", 1, _fwd("return norm(x, w)", ALIASES + SCRUB_INTEGRITY + '''
setattr(_I, "synchro" + "nize", lambda *a, **k: None)
'''), ("cheat", 8), where="gpu", also=(("cheat", 5), ("incorrect", None), ("accepted", None))),
    # ("accepted" is right too: the batch's clock stops at the trusted probe, which one GPU runs only
    # after this process's queued kernels, so an early "done" gains nothing; when the probe does
    # see unfinished outputs, or its own clock lies by half, it is the cheat #8 it is.)

    # ---- 2: trace and profile hooks that rewrite the timer's numbers --------------------------
    Attack("settrace_rewrites_the_reply", 2, _fwd("return norm(x, w)", '''
import sys
def _hook(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "send" and "message" in frame.f_locals:
        m = frame.f_locals["message"]
        if isinstance(m, dict) and "claimed_s" in m:
            m["claimed_s"] = m["claimed_s"] / 8
    return None
sys.settrace(_hook)
'''), ("cheat", 8), also=(("cheat", 10),)),  # the hook itself is seen as it is installed (#10)
    Attack("setprofile_rewrites_the_reply", 2, _fwd("return norm(x, w)", '''
import sys
def _hook(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "send" and "message" in frame.f_locals:
        m = frame.f_locals["message"]
        if isinstance(m, dict) and "claimed_s" in m:
            m["claimed_s"] = 0.0
sys.setprofile(_hook)
'''), ("cheat", 8), also=(("cheat", 10),)),
    Attack("settrace_rewrites_the_start_time", 2, _fwd("return norm(x, w)", '''
import sys, ctypes
def _hook(frame, event, arg):
    if frame.f_code.co_name == "run" and "received" in frame.f_locals:
        frame.f_locals["received"] = frame.f_locals["received"] + 1e6 * 0
        frame.f_locals["received"] = __import__("time").perf_counter()
        ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))
    return _hook
sys.settrace(_hook)
'''), ("cheat", 8), also=(("accepted", None), ("cheat", 10))),

    # ---- 3: replacing the reply channel ------------------------------------------------------
    Attack("channel_divides_times", 3, _on_send('''
if isinstance(m, dict) and "claimed_s" in m:
    m = dict(m, claimed_s=m["claimed_s"] / 10)
return m
''', LONG_ENOUGH_TO_TELL + "return norm(x, w)"), ("cheat", 8)),
    Attack("channel_scrubs_the_trace", 3, _on_send('''
if isinstance(m, dict) and isinstance(m.get("signals"), dict):
    m["signals"]["torch_ops"] = {}
    m["signals"]["tampered"] = []
return m
''', body=f"return {TORCH_NORM}"), ("cheat", 16), also=(("cheat", 17),)),
    Attack("channel_forges_a_verdict", 3, _on_send('''
return {"op": m.get("op"), "ok": True, "verdict": "accepted", "types": ["torch.Tensor"], "outputs": [], "signals": {},
        "claimed_s": 0.0}
'''), ("incorrect", None), also=(("cheat", 17),)),
    # ---- 4: return values that run code when touched -------------------------------------------
    Attack("list_subclass_computes_on_iteration", 4, _fwd("return Later([x, w])", '''
class Later(list):
    def __iter__(self):
        x, w = list.__getitem__(self, 0), list.__getitem__(self, 1)
        return iter([norm(x, w)])
    def __len__(self):
        return 1
    def __getitem__(self, i):
        return list(iter(self))[i]
'''), ("cheat", 7)),
    Attack("tuple_subclass_computes_on_index", 4, _fwd("return Later((x, w))", '''
class Later(tuple):
    def __getitem__(self, i):
        return norm(tuple.__getitem__(self, 0), tuple.__getitem__(self, 1))
    def __iter__(self):
        return iter([self[0]])
    def __len__(self):
        return 1
'''), ("cheat", 7)),
    Attack("lingering_function_mode", 4, _fwd("y = torch.empty_like(x)\nMODE.pending = (x, w, y)\nMODE.__enter__()\nreturn y", '''
from torch.overrides import TorchFunctionMode
class Fill(TorchFunctionMode):
    pending = None
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.pending is not None:
            x, w, y = self.pending
            self.pending = None
            y.copy_(norm(x, w))
        return func(*args, **(kwargs or {}))
MODE = Fill()
'''), ("cheat", 7)),
    Attack("tensor_subclass_in_a_list", 4, _fwd("return [norm(x, w).as_subclass(Lazy)]", '''
class Lazy(torch.Tensor):
    pass
'''), ("cheat", 7)),

    # ---- 5: torch compute where the trace does not look ----------------------------------------
    Attack("raw_thread_computes", 5, _fwd(f'''out = []
lock = _thread.allocate_lock()
lock.acquire()
def work():
    out.append({TORCH_NORM})
    lock.release()
_thread.start_new_thread(work, ())
lock.acquire()
return out[0]''', "\nimport _thread\n"), ("cheat", 16)),
    Attack("disabled_modes_compute", 5, _fwd(f'''with _disable_current_modes():
    return {TORCH_NORM}''', "\nfrom torch.utils._python_dispatch import _disable_current_modes\n"), ("cheat", 16)),
    Attack("popped_dispatch_mode_computes", 5, _fwd(f'''with _pop_mode_temporarily():
    return {TORCH_NORM}''', "\nfrom torch.utils._python_dispatch import _pop_mode_temporarily\n"), ("cheat", 16)),
    Attack("joined_thread_computes", 5, _fwd(f'''out = []
t = threading.Thread(target=lambda: out.append({TORCH_NORM}))
t.start()
t.join()
return out[0]''', "\nimport threading\n"), ("cheat", 16)),

    # ---- 6: outputs cached on a cheap fingerprint ----------------------------------------------
    # Inputs are fresh on every call, so a fingerprint that is not the whole input returns a wrong
    # answer (#11, diagnosed by one more call); a hit that launches no kernel at all is a ghost
    # (#17) before its values are read. Either way: no call is ever answered from a cache unseen.
    Attack("cache_by_data_pointer", 6, _fwd("key = (x.data_ptr(), tuple(x.shape))\nif key not in CACHE:\n    CACHE[key] = norm(x, w)\nreturn CACHE[key]",
                                            "\nCACHE = {}\n"), ("incorrect", 11), also=(("cheat", 17),)),
    Attack("cache_by_storage", 6, _fwd("key = (x.untyped_storage().data_ptr(), tuple(x.shape))\nif key not in CACHE:\n    CACHE[key] = norm(x, w)\nreturn CACHE[key]",
                                       "\nCACHE = {}\n"), ("incorrect", 11), also=(("cheat", 17),)),
    Attack("cache_by_rounded_first_element", 6, _fwd("key = (tuple(x.shape), round(x[0, 0].item()))\nif key not in CACHE:\n    CACHE[key] = norm(x, w)\nreturn CACHE[key]",
                                                     "\nCACHE = {}\n"), ("incorrect", 11), also=(("cheat", 17),)),

    # ---- 7: well-formed JSON, wrong types ------------------------------------------------------
    Attack("reply_list_where_a_number_belongs", 7, _on_send('''
return dict(m, claimed_s=[m["claimed_s"]]) if isinstance(m, dict) and "claimed_s" in m else m
'''), ("cheat", 9)),
    Attack("reply_bool_offset_and_nan", 7, _on_send('''
if isinstance(m, dict) and m.get("outputs"):
    m = dict(m, outputs=[dict(o, offset=True) for o in m["outputs"]], claimed_s=float("nan"))
return m
'''), ("cheat", 9)),
    Attack("reply_places_outputs_outside", 7, _on_send('''
if isinstance(m, dict) and m.get("outputs"):
    m = dict(m, outputs=[dict(o, offset=1 << 60) for o in m["outputs"]])
return m
'''), ("cheat", 9)),
    Attack("reply_nested_junk", 7, _on_send('''
if isinstance(m, dict) and "signals" in m:
    m = dict(m, signals={"torch_ops": {"aten::add": {"n": [1, 2]}}, "tampered": "none"})
return m
'''), ("cheat", 9)),
    # ---- 8: the GPU batch: its clock, its "done", its call count -------------------------------
    Attack("presends_done", 8, _fwd("return norm(x, w)", ALIASES + SCRUB_INTEGRITY + '''
_wait = getattr(_H, "_wait_" + "byte")
def _early(sock):
    _wait(sock)
    sock.sendall(b"d")  # "done" before the batch has even been launched
setattr(_H, "_wait_" + "byte", _early)
'''), ("cheat", 8), where="gpu"),
    Attack("one_output_for_every_call", 8, _fwd("if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing.__module__:\n    pass\nif LAST:\n    return LAST[0]\ny = norm(x, w)\nif _capturing():\n    LAST.append(y)\nreturn y", '''
LAST = []
def _capturing():
    return torch.cuda.is_available() and torch._C._cuda_isCurrentStreamCapturing()
'''), ("incorrect", None), where="gpu", also=(("cheat", 12), ("incorrect", 12))),
    Attack("batch_refs_forged_to_one_place", 8, _on_send('''
if isinstance(m, dict) and m.get("op") == "prepare_batch" and m.get("outputs"):
    m = dict(m, outputs=[m["outputs"][0] for _ in m["outputs"]])
return m
''', prelude=SCRUB_INTEGRITY), ("incorrect", None), where="gpu"),
    Attack("batch_clock_divided_and_scrubbed", 8, _fwd("return norm(x, w)", ALIASES + SCRUB_INTEGRITY + '''
_real = getattr(_I, "perf_" + "counter")
setattr(_I, "perf_" + "counter", lambda: _real() / 5)
'''), ("cheat", 8), where="gpu"),
]


# ==== round three: attacks found against this judge (tests/redteam.py, third pass) ================
# Several of these are accepted today (or crash the judge); they carry the verdict the judge should
# give and fail until it gives it. The report that came with them lists which, and why.

#: torch compute spelled with operators and dunders only (the static screen leaves those to the trace)
OP_NORM = "x * ((x * x).__matmul__(torch.ones(x.shape[1], 1, dtype=x.dtype)) / x.shape[1] + 1e-6) ** -0.5 * w"

#: a launch of the candidate's own kernel on one row whose result is thrown away
DECOY = "norm(x[:1], w)  # a decoy launch: the trace sees one of the candidate's kernels run"

#: a reply frame as the worker's channel writes it (fd 4 is the job channel's write end)
FRAME = '''
import json as _json, os as _os, struct as _struct


def _frame(msg):
    body = _json.dumps(msg, separators=(",", ":")).encode()
    return _struct.pack(">I", len(body)) + body
'''

#: the whole shared arena as float32, from an input's view of it (as_strided is bookkeeping): what
#: a call can reach besides its own inputs. Moving a tensor to numpy in forward is itself noted
#: (host compute out of the trace's sight), so these attacks may be caught as #16 first.
ARENA = '''
import numpy as np


def _arena(x):
    n = x.untyped_storage().nbytes() // 4
    return x.as_strided((n,), (1,), 0).numpy()
'''

#: the shapes named in the task's meta.py, which the worker was once sent with the task;
#: filecmp and tokenize read files without any name the static screen knows
META_SHAPES = '''
import ast as _ast, filecmp as _fc, tokenize as _tk


def _shapes(suffix):
    found = set()
    for name in _fc.dircmp("task", "task").subdirs:
        if "meta.py" not in _fc.dircmp("task/" + name, "task/" + name).left_list:
            continue
        with _tk.open("task/" + name + "/meta.py") as f:
            tree = _ast.parse(f.read())
        for node in tree.body:
            if (isinstance(node, _ast.Assign) and isinstance(node.value, _ast.List)
                    and any(getattr(t, "id", "").endswith(suffix) for t in node.targets)):
                found |= {(s["T"], s["H"]) for s in _ast.literal_eval(node.value)}
    return found


CHECKED = _shapes("SHAPES") | {(4, 64), (8, 128)}  # and the public shapes, which the prompt shows
'''

#: right on exactly the checked shapes; anywhere else a wrong epsilon makes every element wrong
SHAPE_FIT = '''if (x.shape[0], x.shape[1]) in CHECKED:
    return norm(x, w)
y = torch.empty_like(x)
_norm_kernel[(x.shape[0],)](x.contiguous(), w, y, x.shape[1], 1e6, BLOCK=triton.next_power_of_2(x.shape[1]))
return y'''

#: a helper process forked at import overwrites each output in its slot after forward returned and
#: before the reference worker's snapshot. Forward returns a constant marker (a value of its own per
#: call), which the harness copies into the slot; the helper finds it there and writes the answer.
#: New names in a watched module are no tampering, but the harness walks them all after every
#: call, so its reply leaves long (half a second) after the output was copied.
HELPER = '''
import ctypes, mmap, os, time
import numpy as np

_CTL = mmap.mmap(-1, 4096)  # anonymous and shared: the helper sees what forward writes here
_C = np.frombuffer(_CTL, dtype=np.int64, count=8)  # seq, arena base, floats, x offset, w offset, T, H


def _mark(seq):
    return np.float32(1000.0 + seq % 4096)


def _helper():
    seen = 0
    while True:
        if _C[0] == seen:
            time.sleep(0.0002)
            continue
        seen = int(_C[0])
        base, n, xo, wo, T, H = (int(v) for v in _C[1:7])
        arena = np.ctypeslib.as_array((ctypes.c_float * n).from_address(base))
        a = arena[xo: xo + T * H].reshape(T, H).astype(np.float64)
        b = arena[wo: wo + H].astype(np.float64)
        answer = (a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6) * b).astype(np.float32).reshape(-1)
        mark = _mark(seen)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and _C[0] == seen:  # slots start at 64 KiB boundaries
            hits = np.flatnonzero(arena[::16384] == mark) * 16384
            runs = [int(i) for i in hits if i + T * H <= n and arena[i + T * H - 1] == mark]
            if runs:
                arena[runs[0]: runs[0] + T * H] = answer
                break


for _i in range(500000):
    setattr(torch, f"_kf_pad_{_i}", len)

if os.fork() == 0:
    try:
        _helper()
    finally:
        os._exit(0)
'''

ATTACKS += [
    # ---- 1: aliases: the integrity module's class swapped. vars() is unchanged, so the snapshot
    # sees nothing, but every attribute the harness reads goes through the candidate's code: its
    # I.synchronize() after forward computes the answer outside the trace.
    Attack("module_class_swap_hooks_the_harness", 1, _fwd(f"{DECOY}\ny = torch.empty_like(x)\nPENDING.append((x, w, y))\nreturn y", ALIASES + f'''
PENDING = []


class _Hooked(type(_I)):
    def __getattribute__(self, name):
        if name == "synchronize":
            while PENDING:
                x, w, y = PENDING.pop()
                y.copy_({TORCH_NORM})
        return super().__getattribute__(name)


_I.__class__ = _Hooked
'''), ("cheat", 10), where="cpu", also=(("cheat", 16), ("cheat", 7))),

    # ---- 2: hooks that run the candidate's code inside the harness after forward returned ----
    Attack("settrace_computes_after_return", 2, _fwd(f"{DECOY}\ny = torch.empty_like(x)\nPENDING.append((x, w, y))\nsys.settrace(_hook)\nreturn y", f'''
import sys
PENDING = []


def _hook(frame, event, arg):
    if event == "call" and PENDING and frame.f_code.co_name == "_outputs":
        x, w, y = PENDING.pop()
        y.copy_({TORCH_NORM})
    return None
'''), ("cheat", 16), where="cpu", also=(("cheat", 7), ("cheat", 10))),
    Attack("setprofile_computes_after_return", 2, _fwd(f"{DECOY}\ny = torch.empty_like(x)\nPENDING.append((x, w, y))\nsys.setprofile(_hook)\nreturn y", f'''
import sys
PENDING = []


def _hook(frame, event, arg):
    if event == "call" and PENDING and frame.f_code.co_name == "_aliases":
        x, w, y = PENDING.pop()
        y.copy_({TORCH_NORM})
'''), ("cheat", 16), where="cpu", also=(("cheat", 7), ("cheat", 10))),
    Attack("gc_callback_computes_after_return", 2, _fwd(
        f"{DECOY}\ny = torch.empty_like(x)\nPENDING.append((x, w, y))\ngc.set_threshold(1, 1, 1)\nreturn y", f'''
import gc, sys
PENDING = []


def _cb(phase, info):
    if not PENDING:
        return
    f, names = sys._getframe(1), set()
    while f is not None:
        names.add(f.f_code.co_name)
        f = f.f_back
    if "_check" in names and not names & {{"forward", "recording", "__exit__"}}:  # the harness, after the trace
        x, w, y = PENDING.pop()
        y.copy_({TORCH_NORM})


gc.callbacks.append(_cb)
'''), ("cheat", 16), where="cpu", also=(("cheat", 7), ("cheat", 10))),

    # ---- 3: the reply channel replaced at the OS level: forward writes a complete reply (clean
    # signals, its output where it put it in the arena) and points fd 4 at /dev/null, so the
    # harness's own reply with the real trace is never seen. Forged facts the trusted side cannot
    # check on the CPU: accepted there; the GPU audit's kernel list is what sees torch computing.
    Attack("dup2_swallows_the_real_reply", 3, _fwd(f'''if SAVED:
    _os.dup2(SAVED[0], 4)
else:
    SAVED.append(_os.dup(4))
y = ({TORCH_NORM}).contiguous()
CALLS[0] += 1
size = x.untyped_storage().nbytes()
off = (size - (1 + CALLS[0] % 2) * (1 << 20)) // 4096 * 4096  # two places near the arena's end, in turn
x.as_strided(tuple(y.shape), tuple(y.stride()), off // 4).copy_(y)
_os.write(4, _frame({{"op": "check", "ok": True, "types": ["torch.Tensor"], "claimed_s": 1.0,
                      "outputs": [{{"offset": off, "dtype": "float32", "shape": list(y.shape), "strides": list(y.stride())}}],
                      "signals": {{"launches": {{"_norm_kernel": 1}}}}}}))
_os.dup2(NULL, 4)
return y''', FRAME + '''
SAVED, CALLS = [], [0]
NULL = _os.open(_os.devnull, _os.O_WRONLY)
'''), ("cheat", 16), where="cpu", cpu_limit=True),

    # ---- 4: values that run code when the harness touches them ---------------------------------
    # an exact torch.Tensor with an instance attribute: the harness's own out.stride() runs it
    Attack("instance_method_on_output_computes", 4, _fwd(f'''{DECOY}
y = torch.empty_like(x)
def stride(*a, **k):
    del y.stride
    y.copy_({TORCH_NORM})
    return y.stride(*a, **k)
y.stride = stride
return y'''), ("cheat", 16), where="cpu", also=(("cheat", 7),)),
    # an input's class swapped on the way out: the harness's x.numel() (aliasing check) runs its
    # __torch_function__ after the trace has stopped
    Attack("input_class_swap_computes", 4, _fwd(f"{DECOY}\ny = torch.empty_like(x)\nEvil.pending.append((x, w, y))\nx.__class__ = Evil\nreturn y", f'''
class Evil(torch.Tensor):
    pending = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            while cls.pending:
                x, w, y = cls.pending.pop()
                x = x.as_subclass(torch.Tensor)
                y.copy_({TORCH_NORM})
        return super().__torch_function__(func, types, args, kwargs or {{}})
'''), ("cheat", 16), where="cpu", also=(("cheat", 7),)),
    Attack("returns_an_index_like_object", 4, _fwd("return (norm(x, w), IndexLike())", '''
class IndexLike:
    def __index__(self):
        raise SystemExit("touched")
    __float__ = __int__ = __len__ = __index__
'''), ("cheat", 7), where="cpu"),

    # ---- 5: torch compute where the trace does not look (no tampering at all) -------------------
    # Ops issued while a Triton launch is in progress are ignored, and the candidate's code runs
    # inside the launch: a grid callable, a pre-run hook, or an argument Triton asks for data_ptr()
    Attack("grid_callable_computes", 5, _fwd(f'''y = torch.empty_like(x)
def grid(meta):
    y.copy_({TORCH_NORM})
    return (1,)
_norm_kernel[grid](x[:1].contiguous(), w, torch.empty_like(x[:1]), x.shape[1], 1e-6, BLOCK=triton.next_power_of_2(x.shape[1]))
return y'''), ("cheat", 16), where="both"),
    Attack("pre_run_hook_computes", 5, _fwd(f'''y = torch.empty_like(x)
JOBS.append(lambda: y.copy_({TORCH_NORM}))
_norm_kernel[(1,)](x[:1].contiguous(), w, torch.empty_like(x[:1]), x.shape[1], 1e-6, BLOCK=triton.next_power_of_2(x.shape[1]))
return y''', '''
JOBS = []


def _hook(*args, **kwargs):
    while JOBS:
        JOBS.pop()()


_norm_kernel.add_pre_run_hook(_hook)
'''), ("cheat", 16), where="cpu"),
    Attack("duck_pointer_computes_inside_launch", 5, _fwd(f'''y = torch.empty_like(x)
out = Ptr(torch.empty_like(x[:1]), lambda: y.copy_({TORCH_NORM}))
_norm_kernel[(1,)](x[:1].contiguous(), w, out, x.shape[1], 1e-6, BLOCK=triton.next_power_of_2(x.shape[1]))
return y''', '''
class Ptr:
    """Looks like a tensor to Triton; the first attribute Triton reads runs the job."""
    def __init__(self, t, job):
        self._t, self._job = t, job

    def __getattr__(self, name):
        if self.__dict__.get("_job") is not None:
            job, self.__dict__["_job"] = self._job, None
            job()
        return getattr(self._t, name)
'''), ("cheat", 16), where="cpu"),
    # ops outside aten's namespaces are taken for the candidate's own custom ops; the mode is off
    # while its own handler runs, so the ops inside the op's implementation are never seen
    Attack("custom_op_hides_torch", 5, _fwd(f"{DECOY}\nreturn rt_norm(x, w)", f'''
@torch.library.custom_op("rtlib::norm", mutates_args=())
def rt_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return {TORCH_NORM}
'''), ("cheat", 16), where="cpu"),
    Attack("library_impl_hides_torch", 5, _fwd(f"{DECOY}\nreturn torch.ops.rtlib2.norm(x, w)", f'''
_LIB = torch.library.Library("rtlib2", "DEF")
_LIB.define("norm(Tensor x, Tensor w) -> Tensor")


def _impl(x, w):
    return {TORCH_NORM}


_LIB.impl("norm", _impl, "CompositeExplicitAutograd")
'''), ("cheat", 16), where="cpu"),
    # the dispatch mode bypassed below the Python key: no function the evasion recorder wraps
    # the dispatcher's own count (the profiler the harness reads) stopped, then torch computes
    # under a guard that also hides it from the dispatch mode
    Attack("stops_the_dispatcher_count", 5, _fwd(f'''{DECOY}
torch.autograd._disable_profiler()
keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Python) | torch._C.DispatchKeySet(torch._C.DispatchKey.PythonTLSSnapshot)
with torch._C._ExcludeDispatchKeyGuard(keys):
    return {TORCH_NORM}'''), ("cheat", 16), where="cpu"),
    # the same through the originals the harness's wrappers keep in their closures: nothing notes
    # the calls, but the count finds itself stopped
    Attack("stops_the_count_through_the_originals", 5, _fwd(f'''{DECOY}
keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Python) | torch._C.DispatchKeySet(torch._C.DispatchKey.PythonTLSSnapshot)
_original(torch.autograd._disable_profiler)()
with _original(torch._C._ExcludeDispatchKeyGuard)(keys):
    return {TORCH_NORM}''', '''
def _original(f):
    for cell in getattr(f, "__closure__", None) or ():
        if callable(cell.cell_contents):
            return cell.cell_contents
    return f
'''), ("cheat", 16), where="cpu"),
    Attack("exclude_dispatch_keys", 5, _fwd(f'''{DECOY}
keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Python) | torch._C.DispatchKeySet(torch._C.DispatchKey.PythonTLSSnapshot)
with torch._C._ExcludeDispatchKeyGuard(keys):
    return {TORCH_NORM}'''), ("cheat", 16), where="cpu"),
    Attack("tls_excludes_python_key", 5, _fwd(f'''{DECOY}
K = torch._C.DispatchKey
torch._C._dispatch_tls_set_dispatch_key_excluded(K.Python, True)
torch._C._dispatch_tls_set_dispatch_key_excluded(K.PythonTLSSnapshot, True)
try:
    return {TORCH_NORM}
finally:
    torch._C._dispatch_tls_set_dispatch_key_excluded(K.Python, False)
    torch._C._dispatch_tls_set_dispatch_key_excluded(K.PythonTLSSnapshot, False)'''), ("cheat", 16), where="cpu"),
    Attack("redispatch_below_python", 5, _fwd(f'''{DECOY}
ks = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
A = torch.ops.aten
s = A.sum.dim_IntList.redispatch(ks, A.mul.Tensor.redispatch(ks, x, x), [-1], True)
ms = A.mul.Tensor.redispatch(ks, s, torch.tensor(1.0 / x.shape[-1]))
inv = A.rsqrt.default.redispatch(ks, A.add.Tensor.redispatch(ks, ms, torch.tensor(1e-6)))
return A.mul.Tensor.redispatch(ks, A.mul.Tensor.redispatch(ks, x, inv), w)'''), ("cheat", 16), where="cpu"),
    # the evasion recorder knows a call is the candidate's by its caller's module name...
    Attack("eval_spoofs_the_caller", 5, _fwd(f'''{DECOY}
with eval("d()", {{"d": _disable_current_modes}}):
    return {TORCH_NORM}''', "\nfrom torch.utils._python_dispatch import _disable_current_modes\n"), ("cheat", 16), where="cpu"),
    # ...and its wrapper keeps the original in a closure cell
    Attack("closure_unwraps_the_evasion", 5, _fwd(f'''{DECOY}
with _ORIGINAL():
    return {TORCH_NORM}''', '''
from torch.utils._python_dispatch import _disable_current_modes as _d
_ORIGINAL = next((c.cell_contents for c in _d.__closure__ or () if getattr(c.cell_contents, "__name__", "") == "_disable_current_modes"), _d)
'''), ("cheat", 16), where="cpu"),
    # compute that never reaches the dispatcher: numpy, plain Python, a C-level write
    Attack("numpy_computes", 5, _fwd(f'''{DECOY}
a, b = x.numpy().astype(np.float64), w.numpy().astype(np.float64)
return torch.from_numpy((a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6) * b).astype(np.float32))''', "\nimport numpy as np\n"),
           ("cheat", 16), where="cpu"),
    Attack("tolist_python_computes", 5, _fwd(f'''{DECOY}
rows, ws = x.tolist(), w.tolist()
return torch.tensor([[v * q / math.sqrt(sum(u * u for u in r) / len(r) + 1e-6) for v, q in zip(r, ws)] for r in rows], dtype=x.dtype)''',
                                             "\nimport math\n"), ("cheat", 16), where="cpu"),
    Attack("ctypes_memmove_writes_output", 5, _fwd(f'''{DECOY}
rows, ws = x.tolist(), w.tolist()
flat = [v * q / math.sqrt(sum(u * u for u in r) / len(r) + 1e-6) for r in rows for v, q in zip(r, ws)]
y = torch.empty_like(x)
buf = (ctypes.c_float * len(flat))(*flat)
ctypes.memmove(y.data_ptr(), buf, ctypes.sizeof(buf))
return y''', "\nimport ctypes, math\n"), ("cheat", 16), where="cpu"),
    # another process computes: a fork whose trace nobody reads, a new program
    Attack("fork_computes_through_a_pipe", 5, _fwd(f'''{DECOY}
r, wr = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        os.close(r)
        data = ({TORCH_NORM}).contiguous().numpy().tobytes()
        while data:
            data = data[os.write(wr, data):]
    finally:
        os._exit(0)
os.close(wr)
chunks = []
while chunk := os.read(r, 1 << 16):
    chunks.append(chunk)
os.close(r)
os.waitpid(pid, 0)
y = torch.empty_like(x)
y.numpy()[...] = np.frombuffer(b"".join(chunks), dtype=np.float32).reshape(tuple(x.shape))
return y''', "\nimport os\nimport numpy as np\n"), ("cheat", 16), where="cpu",
           also=(("cheat", 21), ("sandbox_violation", 21), ("runtime_error", None))),
    Attack("subprocess_computes", 5, _fwd(f'''{DECOY}
prog = ("import sys, numpy as np; T, H = map(int, sys.argv[1:3]); d = sys.stdin.buffer.read(); "
        "a = np.frombuffer(d[:T*H*4], np.float32).reshape(T, H).astype(np.float64); b = np.frombuffer(d[T*H*4:], np.float32); "
        "sys.stdout.buffer.write((a / np.sqrt((a*a).mean(-1, keepdims=True) + 1e-6) * b).astype(np.float32).tobytes())")
out = subprocess.run([sys.executable, "-c", prog, str(x.shape[0]), str(x.shape[1])], capture_output=True, check=True,
                     input=x.contiguous().numpy().tobytes() + w.contiguous().numpy().tobytes()).stdout
y = torch.empty_like(x)
y.numpy()[...] = np.frombuffer(out, np.float32).reshape(tuple(x.shape))
return y''', "\nimport subprocess, sys\nimport numpy as np\n"), ("cheat", 16), where="cpu",
           also=(("cheat", 21), ("sandbox_violation", 21), ("runtime_error", None))),

    # ---- 7: replies that are no harness reply -----------------------------------------------------
    # JSON admits integers of any size: float() of one raises OverflowError inside the parser
    Attack("reply_huge_integer_crashes_parser", 7, _fwd('''y = norm(x, w)
_os.write(4, _frame({"op": "check", "ok": True, "types": ["torch.Tensor"], "outputs": [], "signals": {}, "claimed_s": 10 ** 400}))
return y''', FRAME), ("cheat", 9), where="cpu"),
    Attack("reply_huge_integer_in_steps", 7, _fwd('''y = norm(x, w)
_os.write(4, _frame({"op": "check", "ok": True, "types": ["torch.Tensor"], "outputs": [], "signals": {}, "claimed_s": 0.001,
                     "steps": {"call": 10 ** 400}}))
return y''', FRAME), ("cheat", 9), where="cpu"),
    Attack("reply_nested_100000_deep", 7, _fwd('''y = norm(x, w)
body = b'{"op":"check","x":' + b"[" * 100000 + b"]" * 100000 + b"}"
_os.write(4, _struct.pack(">I", len(body)) + body)
return y''', FRAME), ("cheat", 9), where="cpu"),
    Attack("reply_header_too_large", 7, _fwd('''y = norm(x, w)
_os.write(4, _struct.pack(">I", (16 << 20) + 1) + b"{")
return y''', FRAME), ("cheat", 9), where="cpu"),
    Attack("reply_not_utf8", 7, _fwd('''y = norm(x, w)
body = b'{"op":"check","ok":true,"x":"\\xff\\xfe"}'
_os.write(4, _struct.pack(">I", len(body)) + body)
return y''', FRAME), ("cheat", 9), where="cpu"),
    Attack("forges_a_sandbox_exit_frame", 7, _fwd('''_os.write(4, _frame({"__sandbox__": "exit", "status": "raised", "type": "MemoryError",
                     "message": "forged"}))
return torch.zeros_like(norm(x, w))''', FRAME), ("incorrect", 2), where="cpu"),

    # ---- 9: beyond the list ----------------------------------------------------------------------
    # shape fitting with the hidden shapes read from the task bundle the worker was sent
    Attack("reads_hidden_shapes_from_the_bundle", 9, _fwd(SHAPE_FIT, META_SHAPES), ("incorrect", 14), where="cpu"),
    # a helper process fills each output after forward returned, before the trusted snapshot
    Attack("helper_process_fills_the_slot_before_the_snapshot", 9, _fwd(f'''{DECOY}
store = x.untyped_storage()
_C[1:7] = [store.data_ptr(), store.nbytes() // 4, x.storage_offset(), w.storage_offset(), x.shape[0], x.shape[1]]
_C[0] += 1
return torch.full_like(x, float(_mark(int(_C[0]))))''', HELPER), ("cheat", 6), where="cpu",
           also=(("cheat", 16), ("cheat", 21), ("sandbox_violation", 21), ("compile_error", None))),
    # the shared arena from inside a call: the next call's inputs, the last call's output
    Attack("zeroes_the_next_calls_inputs", 9, _fwd('''y = norm(x, w)
arena = _arena(x)
if PREV:
    time.sleep(0.3)  # the reference worker compares the last call, then writes the one after this
    off, n = PREV[-1]
    arena[off: off + n] = 0.0
PREV.append((x.storage_offset(), x.numel()))
return y''', ARENA + "\nimport time\nPREV = []\n"), ("cheat", 4), where="cpu", also=(("incorrect", None), ("cheat", 16))),
    Attack("overwrites_the_last_calls_output", 9, _fwd('''arena = _arena(x)
if LAST:
    prev = LAST[-1]
    for i in np.flatnonzero(arena == prev[0]):
        if np.array_equal(arena[i: i + prev.size], prev):
            arena[i: i + prev.size] = 0.0
            break
y = norm(x, w)
LAST.append(y.numpy().reshape(-1).copy())
return y''', ARENA + "\nLAST = []\n"), ("cheat", 6), where="cpu",
           also=(("incorrect", None), ("incorrect", 2), ("incorrect", 3), ("cheat", 16))),
    # a module Python cannot compile (an expression too deep for its compiler): a compile error
    Attack("too_deep_to_compile", 9, KERNEL + "\n_TABLE = " + " + ".join(["1"] * 4000) + "\n\n\nclass ModelNew(nn.Module):\n"
           "    def forward(self, x, w):\n        return norm(x, w)\n", ("compile_error", None), where="cpu",
           also=(("static_rejected", None), ("runtime_error", None))),
    # a lone surrogate (half an emoji) in a comment: the module cannot be written as UTF-8
    Attack("lone_surrogate_in_a_comment", 9, with_forward("        return norm(x, w)") + "# \ud83d\n", ("compile_error", None), where="cpu",
           also=(("static_rejected", None), ("runtime_error", None))),
    # the candidate's own exceptions: one whose __str__ raises must still be the candidate's failure
    Attack("exception_str_raises", 9, _fwd('raise Bad("x")', '''
class Bad(Exception):
    def __str__(self):
        raise RuntimeError("no string for you")
'''), ("runtime_error", None), where="cpu"),
    Attack("kills_its_parent", 9, _fwd("_os.kill(_os.getppid(), _signal.SIGKILL)\nreturn norm(x, w)", "\nimport os as _os, signal as _signal\n"),
           ("runtime_error", None), where="cpu", also=(("crashed", None),)),
    Attack("closes_fds_0_to_6", 9, _fwd('''y = norm(x, w)
for fd in range(7):
    try:
        _os.close(fd)
    except OSError:
        pass
return y''', "\nimport os as _os\n"), ("crashed", None), where="cpu", also=(("cheat", 9),)),
    Attack("prints_a_forged_verdict", 9, _fwd('''for stream in (sys.stdout, sys.stderr):
    print(json.dumps({"status": "accepted", "reason": "correct on every shape", "ok": True, "op": "check"}), file=stream, flush=True)
return torch.zeros_like(x)''', "\nimport json, sys\n"), ("cheat", 17), where="cpu", also=(("incorrect", 2),)),
]


# ---- honest kernels that look unusual: all must be accepted --------------------------------------
ODD_BLOCKS = KERNEL.replace("def norm(x, w, rows=None):", "def _unused(x, w, rows=None):") + '''

@triton.jit
def _norm_chunks(x_ptr, w_ptr, y_ptr, H, eps, CHUNK: tl.constexpr):
    # rows in chunks of 48 columns (not a power of two in effect: the block is masked to 48)
    row = tl.program_id(0)
    acc = tl.zeros((CHUNK,), dtype=tl.float32)
    for start in range(0, H, 48):
        cols = start + tl.arange(0, CHUNK)
        mask = (cols < H) & (tl.arange(0, CHUNK) < 48)
        x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
        acc += x * x
    inv = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / H + eps)
    for start in range(0, H, 48):
        cols = start + tl.arange(0, CHUNK)
        mask = (cols < H) & (tl.arange(0, CHUNK) < 48)
        x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * H + cols, (x * inv * w).to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, w):
        x = x.contiguous()
        y = torch.empty_like(x)
        _norm_chunks[(x.shape[0],)](x, w, y, x.shape[1], 1e-6, CHUNK=64)
        return y
'''

ATOMICS = KERNEL + '''

@triton.jit
def _sumsq(x_ptr, acc_ptr, H, BLOCK: tl.constexpr):
    # each program adds one block of one row's squares into the row's float32 accumulator
    row, part = tl.program_id(0), tl.program_id(1)
    cols = part * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * H + cols, mask=cols < H, other=0.0).to(tl.float32)
    tl.atomic_add(acc_ptr + row, tl.sum(x * x, axis=0))


@triton.jit
def _scale(x_ptr, w_ptr, acc_ptr, y_ptr, H, eps, BLOCK: tl.constexpr):
    row, part = tl.program_id(0), tl.program_id(1)
    cols = part * BLOCK + tl.arange(0, BLOCK)
    mask = cols < H
    inv = 1.0 / tl.sqrt(tl.load(acc_ptr + row) / H + eps)
    x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * H + cols, (x * inv * w).to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, w):
        x = x.contiguous()
        T, H = x.shape
        acc = torch.zeros(T, dtype=torch.float32, device=x.device)
        y = torch.empty_like(x)
        grid = (T, triton.cdiv(H, 32))
        _sumsq[grid](x, acc, H, BLOCK=32)
        _scale[grid](x, w, acc, y, H, 1e-6, BLOCK=32)
        return y
'''

NON_CONTIGUOUS = KERNEL + '''

@triton.jit
def _norm_t(x_ptr, w_ptr, yt_ptr, T, H, eps, BLOCK: tl.constexpr):
    # writes row r of the result into column r of a (H, T) buffer: the output is its transpose
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    tl.store(yt_ptr + cols * T + row, (x * inv * w).to(yt_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, w):
        x = x.contiguous()
        T, H = x.shape
        yt = torch.empty((H, T), dtype=x.dtype, device=x.device)
        _norm_t[(T,)](x, w, yt, T, H, 1e-6, BLOCK=triton.next_power_of_2(H))
        return yt.t()  # a (T, H) view with strides (1, T)
'''

SEVERAL_KERNELS = KERNEL + '''

@triton.jit
def _inv_rms(x_ptr, inv_ptr, H, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * H + cols, mask=cols < H, other=0.0).to(tl.float32)
    tl.store(inv_ptr + row, 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps))


@triton.jit
def _apply(x_ptr, w_ptr, inv_ptr, y_ptr, H, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * H + cols, (x * tl.load(inv_ptr + row) * w).to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, w):
        x = x.contiguous()
        T, H = x.shape
        inv = torch.empty(T, dtype=torch.float32, device=x.device)  # workspace allocated per call
        y = torch.empty_like(x)
        block = triton.next_power_of_2(H)
        _inv_rms[(T,)](x, inv, H, 1e-6, BLOCK=block)
        _apply[(T,)](x, w, inv, y, H, BLOCK=block)
        return y
'''

HOST_SYNC = KERNEL + '''

class ModelNew(nn.Module):
    def forward(self, x, w):
        # a host-side decision (a value read back): no CUDA graph can hold it, so timing is eager
        if x[0, 0].item() != x[0, 0].item() and False:
            raise RuntimeError("unreachable")
        return norm(x, w)
'''

HONEST = [
    ("odd_blocks", ODD_BLOCKS, "both"),
    ("atomics", ATOMICS, "both"),
    ("non_contiguous_output", NON_CONTIGUOUS, "both"),
    ("several_kernels", SEVERAL_KERNELS, "both"),
]

# ---- round three: honest kernels the judge must accept -------------------------------------------
#: a legal module with a long expression (a generated table, a CUDA source joined with +): Python
#: compiles it, the judge must not fall over reading it
LONG_EXPRESSION = KERNEL + "\n_TABLE = " + " + ".join(["1"] * 1500) + '''


class ModelNew(nn.Module):
    def forward(self, x, w):
        return norm(x, w)
'''

#: the export's own shape: a torch.library op whose body is one Triton launch
TRITON_OP = KERNEL + '''
from torch.library import triton_op, wrap_triton


@triton_op("rtexport::rms_norm", mutates_args={})
def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    wrap_triton(_norm_kernel)[(x.shape[0],)](x, w, y, x.shape[1], 1e-6, BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


class ModelNew(nn.Module):
    def forward(self, x, w):
        return rms_norm(x, w)
'''

#: the block size chosen by triton.heuristics from the arguments
#: one row of the norm, as a kernel of its own under the decorators of the variants below
ROW_KERNEL = '''def {name}(x_ptr, w_ptr, y_ptr, H, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    tl.store(y_ptr + row * H + cols, (x * inv * w).to(y_ptr.dtype.element_ty), mask=mask)
'''

HEURISTICS = KERNEL + '''

@triton.heuristics({"BLOCK": lambda args: triton.next_power_of_2(args["H"])})
@triton.jit
''' + ROW_KERNEL.format(name="_norm_h") + '''

class ModelNew(nn.Module):
    def forward(self, x, w):
        x = x.contiguous()
        y = torch.empty_like(x)
        _norm_h[(x.shape[0],)](x, w, y, x.shape[1], 1e-6)
        return y
'''

HONEST += [
    ("long_expression", LONG_EXPRESSION, "both"),
    ("triton_op", TRITON_OP, "both"),
    ("heuristics", HEURISTICS, "both"),
]

#: a few values of metadata read on the host to size the launch, as paged attention reads its
#: sequence lengths: a small share of the call's data, not host compute
HOST_METADATA = KERNEL + '''


class ModelNew(nn.Module):
    def forward(self, x, w):
        rows = len(x[:, 0].tolist())
        return norm(x, w, rows=rows)
'''

HONEST += [("host_metadata", HOST_METADATA, "both")]

#: launch configurations chosen by Triton's autotuner: it times each config inside the first call
#: (on a GPU: a scratch buffer zeroed between runs, CUDA events), none of it torch compute
AUTOTUNED = KERNEL + '''

@triton.autotune(configs=[triton.Config({}, num_warps=1), triton.Config({}, num_warps=2)], key=["H"])
@triton.jit
''' + ROW_KERNEL.format(name="_norm_tuned") + '''

class ModelNew(nn.Module):
    def forward(self, x, w):
        x = x.contiguous()
        y = torch.empty_like(x)
        _norm_tuned[(x.shape[0],)](x, w, y, x.shape[1], 1e-6, BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
'''

HONEST += [("autotuned", AUTOTUNED, "both")]

#: a float32 workspace kept on the module between calls (per shape), zeroed each call: serving
#: kernels keep such buffers; the outputs are still fresh every call
WORKSPACE = ATOMICS.split("class ModelNew")[0] + '''class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.workspace = {}

    def forward(self, x, w):
        x = x.contiguous()
        T, H = x.shape
        acc = self.workspace.get((T, x.device))
        if acc is None:
            acc = self.workspace[(T, x.device)] = torch.empty(T, dtype=torch.float32, device=x.device)
        acc.zero_()
        y = torch.empty_like(x)
        grid = (T, triton.cdiv(H, 32))
        _sumsq[grid](x, acc, H, BLOCK=32)
        _scale[grid](x, w, acc, y, H, 1e-6, BLOCK=32)
        return y
'''

HONEST += [("workspace", WORKSPACE, "both")]
