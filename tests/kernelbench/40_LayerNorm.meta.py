"""CPU-sized shapes for KernelBench level 1 40_LayerNorm (Triton interpreter).

The problem beside this file is a verbatim copy of
bench/kernelbench/problems/level1/40_LayerNorm.py; only sizes change here. The hidden shapes give
every size global small, odd values: rows of 5*33*29 = 4785 elements take two BLOCK=4096 chunks.
"""

CPU_PUBLIC_SHAPES = [{'batch_size': 2, 'features': 4, 'dim1': 8, 'dim2': 9}]
CPU_HIDDEN_SHAPES = [
    {'batch_size': 1, 'features': 1, 'dim1': 1, 'dim2': 1},
    {'batch_size': 3, 'features': 5, 'dim1': 33, 'dim2': 29},
    {'batch_size': 2, 'features': 3, 'dim1': 1, 'dim2': 7},
]
