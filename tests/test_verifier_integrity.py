"""The integrity snapshot (verifier/integrity.py) against torch's own import of dynamo, which a CPU
worker's warm-up leaves to the candidate that needs it (Inductor's helpers import it): that import
rewraps ``torch.manual_seed``, and only that rewrap is not a swap. Run in a fresh interpreter: the
test process may have imported dynamo already."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, sys
import torch, torch.profiler, triton
from kernforge.verifier import integrity
assert "torch._dynamo" not in sys.modules, "the fresh process imported dynamo before the snapshot"
before = integrity.snapshot()
seen = {"clean": integrity.tampered(before)}
from torch._inductor.runtime import triton_helpers  # imports torch._dynamo
seen["dynamo imported"] = integrity.tampered(before)
original = torch.random.manual_seed
torch.manual_seed = torch._disable_dynamo(lambda seed: None)
seen["dynamo's wrapper of another function"] = integrity.tampered(before)
fake = lambda seed: None
fake.__wrapped__ = original
torch.manual_seed = fake
seen["another function claiming to wrap it"] = integrity.tampered(before)
torch.manual_seed = original
torch.cuda.synchronize = lambda *a: None
seen["a swap elsewhere"] = integrity.tampered(before)
print(json.dumps(seen))
"""


def test_only_dynamos_own_rewrap_of_manual_seed_is_not_a_swap():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"clean": [], "dynamo imported": [],
                    "dynamo's wrapper of another function": ["torch.manual_seed"],
                    "another function claiming to wrap it": ["torch.manual_seed"],
                    "a swap elsewhere": ["torch.cuda.synchronize"]}
