"""CPU-sized shapes for KernelBench level 1 31_ELU (Triton interpreter).

The problem beside this file is a verbatim copy of bench/kernelbench/problems/level1/31_ELU.py; only
sizes change here. The hidden shapes give every size global small, odd values: the flattened tensor
crosses a BLOCK=2048 boundary and leaves a masked tail.
"""

CPU_PUBLIC_SHAPES = [{'batch_size': 4, 'dim': 300}]
CPU_HIDDEN_SHAPES = [
    {'batch_size': 1, 'dim': 1},
    {'batch_size': 3, 'dim': 2049},
    {'batch_size': 5, 'dim': 77},
]
