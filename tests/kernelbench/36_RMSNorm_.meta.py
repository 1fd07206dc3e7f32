"""CPU-sized shapes for KernelBench level 1 36_RMSNorm_ (Triton interpreter).

The problem beside this file is a verbatim copy of bench/kernelbench/problems/level1/36_RMSNorm_.py;
only sizes change here. The hidden shapes give every size global small, odd values: inner=5*29=145
takes two BLOCK_I=128 column blocks and 37 features two BLOCK_R=32 steps.
"""

CPU_PUBLIC_SHAPES = [{'batch_size': 2, 'features': 8, 'dim1': 5, 'dim2': 7}]
CPU_HIDDEN_SHAPES = [
    {'batch_size': 1, 'features': 1, 'dim1': 1, 'dim2': 1},
    {'batch_size': 2, 'features': 37, 'dim1': 5, 'dim2': 29},
    {'batch_size': 3, 'features': 3, 'dim1': 2, 'dim2': 1},
]
