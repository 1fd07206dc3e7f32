"""long_matvec: one public shape whose K (a million) makes a sequential float32 sum drift by
about 2^-12.7 relative, out of float32's tolerance (rtol 1e-4); small hidden shapes."""

import torch

PUBLIC_SHAPES = [{"M": 16, "K": 1 << 20}]
HIDDEN_SHAPES = [{"M": 3, "K": 1000}, {"M": 17, "K": 4099}]
CPU_PUBLIC_SHAPES = PUBLIC_SHAPES
CPU_HIDDEN_SHAPES = HIDDEN_SHAPES
# Uniform [0, 1) like KernelBench's torch.rand: every product is positive, so the running sum
# only grows and its float32 rounding errors pile up instead of cancelling.
DISTRIBUTIONS = ("uniform",)
DTYPES = {"cuda": "float32", "cpu": "float32"}


def make_inputs(shape, dist, dtype, device, generator):
    m, k = shape["M"], shape["K"]
    a = torch.rand(m, k, device=device, generator=generator)
    b = torch.rand(k, 1, device=device, generator=generator)
    return [a.to(dtype), b.to(dtype)]


def roofline(shape, dtype):
    m, k = shape["M"], shape["K"]
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return (m * k + k + m) * elem, 2 * m * k
