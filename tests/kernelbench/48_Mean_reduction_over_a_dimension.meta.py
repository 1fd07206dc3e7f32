"""CPU-sized shapes for KernelBench level 1 48_Mean_reduction_over_a_dimension (Triton interpreter).

The problem beside this file is a verbatim copy of
bench/kernelbench/problems/level1/48_Mean_reduction_over_a_dimension.py; only sizes change here. The
hidden shapes give every size global small, odd values: inner=129 takes two BLOCK_I=128 column
blocks and dim1=70 three BLOCK_R=32 steps; inner=1 too.
"""

CPU_PUBLIC_SHAPES = [{'batch_size': 3, 'dim1': 40, 'dim2': 33}]
CPU_HIDDEN_SHAPES = [
    {'batch_size': 1, 'dim1': 1, 'dim2': 1},
    {'batch_size': 2, 'dim1': 70, 'dim2': 129},
    {'batch_size': 3, 'dim1': 5, 'dim2': 1},
    {'batch_size': 2, 'dim1': 33, 'dim2': 5},
]
