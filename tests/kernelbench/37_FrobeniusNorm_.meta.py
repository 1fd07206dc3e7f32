"""CPU-sized shapes for KernelBench level 1 37_FrobeniusNorm_ (Triton interpreter).

The problem beside this file is a verbatim copy of
bench/kernelbench/problems/level1/37_FrobeniusNorm_.py; only sizes change here. The hidden shapes
give every size global small, odd values: 3*5*33*70 = 34650 elements take two partial-sum chunks of
8 * 4096.
"""

CPU_PUBLIC_SHAPES = [{'batch_size': 2, 'features': 4, 'dim1': 8, 'dim2': 9}]
CPU_HIDDEN_SHAPES = [
    {'batch_size': 1, 'features': 1, 'dim1': 1, 'dim2': 1},
    {'batch_size': 3, 'features': 5, 'dim1': 33, 'dim2': 70},
    {'batch_size': 2, 'features': 3, 'dim1': 5, 'dim2': 7},
]
