"""CPU-sized shapes for KernelBench level 1 24_LogSoftmax (Triton interpreter).

The problem beside this file is a verbatim copy of
bench/kernelbench/problems/level1/24_LogSoftmax.py; only sizes change here. The hidden shapes give
every size global small, odd values: rows of 5000 take two BLOCK=4096 steps, the second masked.
"""

CPU_PUBLIC_SHAPES = [{'batch_size': 4, 'dim': 300}]
CPU_HIDDEN_SHAPES = [
    {'batch_size': 1, 'dim': 1},
    {'batch_size': 3, 'dim': 5000},
    {'batch_size': 5, 'dim': 77},
]
