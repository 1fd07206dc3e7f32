"""A device-side fingerprint of a tensor's bytes, identical in any process on the same device.

The candidate's harness fingerprints the inputs after the call; the judge's reference worker
fingerprints the pristine inputs drawn from the same seed. A difference means the candidate
wrote to an input it must only read (THREATS #4) — decided by the judge, not in the candidate's
process. A weighted sum of 64-bit words with wrap-around arithmetic is order-independent, so the
GPU's reduction order does not matter, and any single changed word changes it.
"""

from __future__ import annotations

import torch

_CHUNK = 1 << 24  # words per step: bounds the temporary memory to a few hundred MB
_MULT = 0x9E3779B97F4A7C15 - (1 << 64)  # odd 64-bit constant, as a signed int64


def digest(tensor: torch.Tensor) -> str:
    raw = tensor.detach().contiguous().view(-1).view(torch.uint8)
    pad = (-raw.numel()) % 8
    if pad:
        raw = torch.cat([raw, torch.zeros(pad, dtype=torch.uint8, device=raw.device)])
    words = raw.view(torch.int64)
    total = torch.zeros((), dtype=torch.int64, device=raw.device)
    for start in range(0, words.numel(), _CHUNK):
        chunk = words[start : start + _CHUNK]
        # weight_i = (i + 1) * MULT (wrapping): every position counts differently
        idx = torch.arange(start + 1, start + 1 + chunk.numel(), dtype=torch.int64, device=raw.device)
        total = total + (chunk * (idx * _MULT)).sum()
    return f"{int(total) & 0xFFFFFFFFFFFFFFFF:016x}:{tensor.dtype}:{list(tensor.shape)}"
