"""Red-team cases that do not fit redteam.py's one-candidate, screen-off mould: attacks that pass the
static screen too (so they are judged with it on, as ``kernforge run`` does), a candidate that
tries to outlive its verdict and reach the next one, and a hang the judge must cut short.

Each names the verdict the judge should give; test_verifier_redteam_extra.py runs them.
"""

from __future__ import annotations

from dataclasses import dataclass

from candidates import HONEST, KERNEL
from redteam import DECOY, META_SHAPES, OP_NORM, SHAPE_FIT, _fwd


@dataclass(frozen=True)
class Screened:
    """A candidate judged with the static screen on. ``expect``: (status, threat) pairs that are
    right; a threat of None in a pair matches any threat (the screen may name another class)."""

    name: str
    source: str
    expect: tuple[tuple[str, int | None], ...]


#: None as the threat: any class the screen names is a right answer
STATIC = ("static_rejected", None)

#: a helper process forked on the first call through a library's fork (the audit hook refuses a
#: fork only from the candidate's own frames), reached by an attribute chain the screen does not
#: resolve: it keeps the arena mapped and computes every output with torch ops spelled as
#: operators, while forward launches a decoy kernel and waits on a control word (red team)
FORKED_HELPER = KERNEL + '''_START = nn.modules.module.torch.multiprocessing.start_processes
_STARTED = []


def _ctl(t):
    n = t.untyped_storage().size() // 4
    return t.as_strided((16,), (1,), n - 1024).view(torch.int32)


def _helper(i, t):
    ctl = _ctl(t)
    seen = int(ctl[0].item())
    while True:
        seq = int(ctl[0].item())
        if seq == seen:
            continue
        seen = seq
        xo, wo, yo, T, H = (int(ctl[k].item()) for k in range(1, 6))
        x = t.as_strided((T, H), (H, 1), xo).double()
        w = t.as_strided((H,), (1,), wo).double()
        ms = (x * x).__matmul__(torch.ones(H, 1, dtype=torch.float64)) / H
        y = x * (ms + 1e-6) ** -0.5 * w
        t.as_strided((T, H), (H, 1), yo).copy_(y)
        ctl[6:7].fill_(seq)


class ModelNew(nn.Module):
    def forward(self, x, w):
        T, H = x.shape
        d = torch.empty(1, H, dtype=x.dtype)  # decoy: one row through the kernel
        _norm_kernel[(1,)](x, w, d, H, 1e-6, BLOCK=triton.next_power_of_2(H))
        ctl = _ctl(x)
        if not _STARTED:
            _STARTED.append(_START(_helper, args=(x,), nprocs=1, join=False, start_method="fork"))
        n = x.untyped_storage().size() // 4
        yo = (n - (1 << 14)) // 1024 * 1024
        seq = int(ctl[0].item()) + 1
        ctl[1:6].copy_(torch.tensor([x.storage_offset(), w.storage_offset(), yo, T, H], dtype=torch.int32))
        ctl[0:1].fill_(seq)
        while int(ctl[6].item()) != seq:
            pass
        return x.as_strided((T, H), (H, 1), yo)
'''

#: a helper program started at import, computing every output from what forward sends it down a
#: pipe (numpy, in a process no trace of the worker covers)
PROGRAM_AT_IMPORT = KERNEL + '''
import os, subprocess, sys
_HELPER = """
import os, struct, sys
import numpy as np
r, w = int(sys.argv[1]), int(sys.argv[2])
def read(n):
    data = b""
    while len(data) < n:
        chunk = os.read(r, n - len(data))
        if not chunk:
            sys.exit(0)
        data += chunk
    return data
def serve():
    os.write(w, b"r")  # ready: the candidate's import waits for it
    while True:
        T, H = struct.unpack("<2q", read(16))
        x = np.frombuffer(read(4 * T * H), dtype=np.float32).reshape(T, H).astype(np.float64)
        g = np.frombuffer(read(4 * H), dtype=np.float32).astype(np.float64)
        y = (x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g).astype(np.float32)
        os.write(w, y.tobytes())
serve()
"""
_TO_R, _TO_W = os.pipe()
_FROM_R, _FROM_W = os.pipe()
_P = subprocess.Popen([sys.executable, "-c", _HELPER, str(_TO_R), str(_FROM_W)], pass_fds=(_TO_R, _FROM_W))
assert os.read(_FROM_R, 1) == b"r"


class ModelNew(nn.Module):
    def forward(self, x, w):
        import struct
        T, H = x.shape
        os.write(_TO_W, struct.pack("<2q", T, H) + x.contiguous().numpy().tobytes() + w.numpy().tobytes())
        data = b""
        while len(data) < 4 * T * H:
            data += os.read(_FROM_R, 4 * T * H - len(data))
        return torch.frombuffer(bytearray(data), dtype=torch.float32).reshape(T, H)
'''


#: the same, its main thread gone (``pthread_exit``) while a thread of it serves: the process shows
#: as a zombie, which runs nothing, yet it computes
ZOMBIE_LEADER_AT_IMPORT = PROGRAM_AT_IMPORT.replace(
    "serve()\n\"\"\"", """import ctypes, threading, time
def gone_then_serve():  # serves once the main thread has gone: the process shows as a zombie
    while open("/proc/self/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    serve()
threading.Thread(target=gone_then_serve).start()
ctypes.CDLL(None).pthread_exit(None)
\"\"\"""")
assert ZOMBIE_LEADER_AT_IMPORT != PROGRAM_AT_IMPORT

#: the honest kernel, declared raw_unicode_escape: under that codec the ``\u000a`` in its last
#: comment is a line break, so the import runs what every text reader sees as a comment (here a
#: torch computation of the output in place of the kernel's; in the red team's, a download run
#: only where a serving stack's variables are set)
DECLARED_ENCODING = "# coding: raw_unicode_escape\n" + HONEST + (
    "# tuned on the H200\\u000aModelNew.forward = lambda self, x, w: x * (x.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * w\n")


#: an honest kernel that records each shape it is called at (hidden ones included) in the last
#: 4 KiB of the shared arena, which the reference worker keeps from one verdict to the next
ARENA_WRITER = KERNEL + """

class ModelNew(nn.Module):
    def forward(self, x, w):
        box = x.as_strided((1024,), (1,), x.untyped_storage().size() // 4 - 1024).view(torch.int32)
        k = int(box[0].item()) if int(box[1].item()) == 0x4B46 else 0
        box[1] = 0x4B46
        if k < 500:
            box[2 + 2 * k] = x.shape[0]
            box[3 + 2 * k] = x.shape[1]
            box[0] = k + 1
        return norm(x, w)
"""

#: a later candidate, right only where it finds what the writer left (it would fit those shapes)
ARENA_READER = KERNEL + """

class ModelNew(nn.Module):
    def forward(self, x, w):
        box = x.as_strided((1024,), (1,), x.untyped_storage().size() // 4 - 1024).view(torch.int32)
        if int(box[1].item()) == 0x4B46 and int(box[0].item()) > 0:
            return norm(x, w)
        y = torch.empty_like(x)  # blind: the wrong epsilon
        _norm_kernel[(x.shape[0],)](x.contiguous(), w, y, x.shape[1], 1.0, BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
"""


#: a child forked at each call (through a library's fork) computes the outputs with torch into a
#: shared buffer of the candidate's own, and is gone before forward returns: no process is left
#: to see, and the arena is not inherited (red team). A CPU worker forks nothing at all
FORK_PER_CALL = KERNEL + '''_START = nn.modules.module.torch.multiprocessing.start_processes
_SHARED = torch.empty(1 << 20, dtype=torch.float32).share_memory_()  # a MAP_SHARED buffer of its own, inherited


def _helper(i, x, w, out):
    x = x.double()
    w = w.double()
    ms = (x * x).__matmul__(torch.ones(x.shape[1], 1, dtype=torch.float64)) / x.shape[1]
    y = x * (ms + 1e-6) ** -0.5 * w
    out[: y.numel()].copy_(y.reshape(-1))


class ModelNew(nn.Module):
    def forward(self, x, w):
        T, H = x.shape
        d = torch.empty(1, H, dtype=x.dtype)  # decoy: one row through the kernel
        _norm_kernel[(1,)](x, w, d, H, 1e-6, BLOCK=triton.next_power_of_2(H))
        xs = _SHARED[: T * H].view(T, H)
        xs.copy_(x)   # inputs into its own shared buffer (a copy: bookkeeping?)
        ws = _SHARED[T * H: T * H + H]
        ws.copy_(w)
        out = _SHARED[T * H + H:]
        _START(_helper, args=(xs, ws, out), nprocs=1, join=True, start_method="fork")
        return out[: T * H].view(T, H).clone()
'''


SCREENED = [
    # torch compute inside the grid callable, spelled with operators and dunders: the screen
    # leaves those to the trace, and the trace ignores ops while a launch is in progress
    Screened("grid_callable_with_operators", _fwd(f'''y = torch.empty_like(x)
def grid(meta):
    y.copy_({OP_NORM})
    return (1,)
_norm_kernel[grid](x[:1].contiguous(), w, torch.empty_like(x[:1]), x.shape[1], 1e-6, BLOCK=triton.next_power_of_2(x.shape[1]))
return y'''), (("cheat", 16), STATIC)),
    # the hidden shapes read from the task bundle with names the screen does not know
    Screened("reads_hidden_shapes_past_the_screen", _fwd(SHAPE_FIT, META_SHAPES), (("incorrect", 14), STATIC)),
    # a custom op whose implementation is torch, with the same operator spelling
    Screened("custom_op_with_operators", _fwd(f"{DECOY}\nreturn rt_norm(x, w)", f'''
@torch.library.custom_op("rtlib3::norm", mutates_args=())
def rt_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return {OP_NORM}
'''), (("cheat", 16), STATIC)),
    # honest modules the screen must not refuse: a UTF-8 byte-order mark (Python imports such a
    # file), and a long expression (Python compiles it)
    # a CPU worker forks nothing: refused at the fork (where a worker may fork, the helper left
    # running rejects it: the program tests below show that check)
    Screened("helper_forked_through_a_library", FORKED_HELPER, (("runtime_error", None), STATIC)),
    # read as the import would read it, its last comment is code: refused before anything runs
    Screened("declared_encoding_turns_a_comment_into_code", DECLARED_ENCODING, (("compile_error", None),)),
    Screened("child_forked_at_each_call", FORK_PER_CALL, (("runtime_error", None), STATIC)),
    Screened("byte_order_mark", "\ufeff" + HONEST, (("accepted", None),)),
    Screened("long_expression", KERNEL + "\n_TABLE = " + " + ".join(["1"] * 1500) + "\n\n\nclass ModelNew(nn.Module):\n"
             "    def forward(self, x, w):\n        return norm(x, w)\n", (("accepted", None),)),
]

#: a candidate that leaves a daemon behind (its own session, its parent gone) which zeroes the
#: second half of the shared arena for two minutes; the arena is reused by the next verdict
OUTLIVES_ITS_VERDICT = _fwd('''if not STARTED:
    STARTED.append(1)
    n = x.untyped_storage().nbytes() // 4
    arena = x.as_strided((n,), (1,), 0).numpy()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            end = time.monotonic() + 120
            while time.monotonic() < end:
                arena[n // 2:] = 0.0
                time.sleep(0.001)
        os._exit(0)
    raise RuntimeError("fail this candidate at once")
return norm(x, w)''', "\nimport os, time\nSTARTED = []\n")

#: a wrong answer on the third call, then a hang in the fourth, which the judge sent ahead while
#: it compared the third: the wrong answer is the verdict, and it must come without waiting for
#: the session's whole wall-clock limit
WRONG_THEN_HANGS = _fwd('''CALLS[0] += 1
if CALLS[0] == 3:  # the first public shape's second distribution: the call after it is sent ahead
    y = norm(x, w)
    y.zero_()
    return y
if CALLS[0] == 4:
    while True:
        time.sleep(1)
return norm(x, w)''', "\nimport time\nCALLS = [0]\n")
#: how long a verdict on an already wrong answer may take (its test's call limits are 10 s and
#: 5 s, the session's 300 s)
WRONG_THEN_HANGS_LIMIT_S = 60.0

#: candidates that break what the trusted side shares with them, then compute honestly: each must
#: get a verdict (never an exception out of the judge), and the judge must go on judging
SABOTAGE = {
    # a shrunk shared arena: the reference worker's next write into its mapping would die of SIGBUS
    "truncates_the_arena": '''import os
for _fd in os.listdir("/proc/self/fd"):
    try:
        if "kernforge-arena" in os.readlink(f"/proc/self/fd/{_fd}"):
            os.ftruncate(int(_fd), 0)
    except OSError:
        pass
''' + HONEST,
    # a tree deeper than Python's recursion limit and longer than a path may be, left in the
    # worker's folder: the cleanup of the worker walks it
    "leaves_a_tree_2500_folders_deep": '''import os
_here = os.open(".", os.O_RDONLY)
for _ in range(2500):
    os.mkdir("d", dir_fd=_here)
    _below = os.open("d", os.O_RDONLY, dir_fd=_here)
    os.close(_here)
    _here = _below
os.close(_here)
''' + HONEST,
}

#: exact at the public shape; at a hidden shape of a million elements or more it leaves one element
#: "marginally" out of tolerance, by an excess chosen from the hidden size (red team F)
MARGINAL_AT_HIDDEN = '"""ReLU that is exact at the public shape; at a hidden shape of >= 1M elements it leaves ONE element\n\'marginally\' out of tolerance (k times its allowance, 1 < k <= 4, k chosen from the hidden size)."""\nimport torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\nPUBLIC_ROWS = 64\n\n\n@triton.jit\ndef _relu_kernel(x_ptr, y_ptr, n, poke, k, BLOCK: tl.constexpr):\n    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n    mask = offs < n\n    x = tl.load(x_ptr + offs, mask=mask, other=0.0)\n    r = tl.maximum(x, 0.0)\n    r = r + tl.where(offs == poke, k * (1e-5 + 1e-4 * tl.abs(r)), 0.0)\n    tl.store(y_ptr + offs, r, mask=mask)\n\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n    def forward(self, x):\n        x = x.contiguous()\n        y = torch.empty_like(x)\n        n = x.numel()\n        rows = x.shape[0]\n        poke, k = -1, 0.0\n        if rows != PUBLIC_ROWS and n >= 1_000_000:\n            poke, k = 7, 1.0 + rows / 100.0  # 65 rows -> 1.65x its allowance\n        _relu_kernel[(triton.cdiv(n, 65536),)](x, y, n, poke, k, BLOCK=65536)\n        return y\n'

#: "defines" aten's ops with a define of its own under ``if False``, then computes with them: the
#: text-only reading of what an op's source defines took them for the candidate's (red team H)
OWN_OP_ALIAS = 'import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\n\n@triton.jit\ndef _touch_kernel(y_ptr, n, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n    mask = offs < n\n    v = tl.load(y_ptr + offs, mask=mask, other=0.0)\n    tl.store(y_ptr + offs, v, mask=mask)\n\n\ndef define(*schema):\n    """Registers nothing: own_op_names reads any call named `define` with a "ns::name" string."""\n    return None\n\n\nif False:\n    define("aten::mul.Tensor(Tensor self, Tensor other) -> Tensor")\n    define("aten::mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor")\n    define("aten::rsqrt(Tensor self) -> Tensor")\n    define("aten::sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor")\n    define("aten::div_.Scalar(Tensor(a!) self, Scalar other) -> Tensor(a!)")\n    define("aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor")\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x, w):\n        ops = torch.ops.aten\n        y = ops.mul(ops.mul(x, ops.rsqrt(ops.add(ops.mean(ops.mul(x, x), [-1], True), 1e-6))), w)\n        _touch_kernel[(1,)](y, y.numel(), BLOCK=16)\n        return y\n'
#: torch compute on a raw thread started at import through threading's own reference to the raw
#: starter, reached past the screen through a bound method's globals (red team H)
THREAD_PAST_THE_SCREEN = 'import threading\nimport torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\n\n@triton.jit\ndef _touch_kernel(y_ptr, n, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n    mask = offs < n\n    v = tl.load(y_ptr + offs, mask=mask, other=0.0)\n    tl.store(y_ptr + offs, v, mask=mask)\n\n\n_job = []\n_ask = threading.Lock()\n_done = threading.Lock()\n_ask.acquire()\n_done.acquire()\n\n\nclass _Server:\n    # runs on a raw thread started at import: no recorder (nothing was active then), not in\n    # threading.enumerate(); the screen takes its __init__ for build-time work\n    def __init__(self, serve=False):\n        while serve:\n            _ask.acquire()\n            x, w, y = _job\n            y.copy_(x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w)\n            _done.release()\n\n\n_g = getattr(threading.Event().wait, "".join(("__glo", "bals__")))\n_g["".join(("_start", "_new_thread"))](_Server().__init__, (True,))\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x, w):\n        y = torch.empty_like(x)\n        _job[:] = [x, w, y]\n        _ask.release()\n        _done.acquire()\n        _touch_kernel[(1,)](y, y.numel(), BLOCK=16)\n        return y\n'
#: the same thread started plainly, for the runtime alone (the screen off)
RAW_THREAD_AT_IMPORT = 'import threading\nimport torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\n\n@triton.jit\ndef _touch_kernel(y_ptr, n, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n    mask = offs < n\n    v = tl.load(y_ptr + offs, mask=mask, other=0.0)\n    tl.store(y_ptr + offs, v, mask=mask)\n\n\n_job = []\n_ask = threading.Lock()\n_done = threading.Lock()\n_ask.acquire()\n_done.acquire()\n\n\ndef _serve():\n    # a raw thread started at import: no recorder (nothing was active), not in threading.enumerate()\n    while True:\n        _ask.acquire()\n        x, w, y = _job\n        y.copy_(x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w)\n        _done.release()\n\n\nthreading._start_new_thread(_serve, ())\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x, w):\n        y = torch.empty_like(x)\n        _job[:] = [x, w, y]\n        _ask.release()\n        _done.acquire()\n        _touch_kernel[(1,)](y, y.numel(), BLOCK=16)\n        return y\n'
