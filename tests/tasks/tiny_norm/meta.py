"""tiny_norm: two public and two hidden shapes, two distributions; bf16 on GPU, fp32 on CPU."""

import torch

PUBLIC_SHAPES = [{"T": 4, "H": 64}, {"T": 8, "H": 128}]
HIDDEN_SHAPES = [{"T": 3, "H": 96}, {"T": 5, "H": 200}]
CPU_PUBLIC_SHAPES = PUBLIC_SHAPES
CPU_HIDDEN_SHAPES = HIDDEN_SHAPES
DISTRIBUTIONS = ("normal", "large")
DTYPES = {"cuda": "bfloat16", "cpu": "float32"}


def make_inputs(shape, dist, dtype, device, generator):
    t, h = shape["T"], shape["H"]
    x = torch.randn(t, h, device=device, generator=generator)
    if dist == "large":
        x = 300.0 + 50.0 * x
    w = 1.0 + 0.1 * torch.randn(h, device=device, generator=generator)
    return [x.to(dtype), w.to(dtype)]


def roofline(shape, dtype):
    t, h = shape["T"], shape["H"]
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return (2 * t * h + h) * elem, 4 * t * h
