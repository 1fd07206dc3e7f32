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
    Attack("alias_divides_the_clock_and_scrubs", 1, _fwd("return norm(x, w)", ALIASES + SCRUB_INTEGRITY + '''
_real = getattr(_I, "perf_" + "counter")
setattr(_I, "perf_" + "counter", lambda: _real() / 8)
'''), ("cheat", 8)),
    Attack("alias_hides_torch_ops", 1, _fwd(f"return {TORCH_NORM}", ALIASES + HIDE_TORCH_OPS), ("cheat", 10)),
    Attack("alias_hides_torch_ops_and_scrubs", 1, _fwd(f"return {TORCH_NORM}", ALIASES + SCRUB_INTEGRITY + HIDE_TORCH_OPS), ("cheat", 16), also=(("cheat", 17),)),
    Attack("decoy_launch_hides_torch_compute", 1, _fwd(f"norm(x[:1], w)  # a decoy launch: its result is thrown away\nreturn {TORCH_NORM}", ALIASES + SCRUB_INTEGRITY + HIDE_TORCH_OPS), ("cheat", 16), cpu_limit=True),
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
'''), ("cheat", 8)),
    Attack("setprofile_rewrites_the_reply", 2, _fwd("return norm(x, w)", '''
import sys
def _hook(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "send" and "message" in frame.f_locals:
        m = frame.f_locals["message"]
        if isinstance(m, dict) and "claimed_s" in m:
            m["claimed_s"] = 0.0
sys.setprofile(_hook)
'''), ("cheat", 8)),
    Attack("settrace_rewrites_the_start_time", 2, _fwd("return norm(x, w)", '''
import sys, ctypes
def _hook(frame, event, arg):
    if frame.f_code.co_name == "run" and "received" in frame.f_locals:
        frame.f_locals["received"] = frame.f_locals["received"] + 1e6 * 0
        frame.f_locals["received"] = __import__("time").perf_counter()
        ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))
    return _hook
sys.settrace(_hook)
'''), ("cheat", 8), also=(("accepted", None),)),

    # ---- 3: replacing the reply channel ------------------------------------------------------
    Attack("channel_divides_times", 3, _on_send('''
if isinstance(m, dict) and "claimed_s" in m:
    m = dict(m, claimed_s=m["claimed_s"] / 10)
return m
'''), ("cheat", 8)),
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
