"""CPU-sized shapes for KernelBench level 1 47_Sum_reduction_over_a_dimension (Triton interpreter).

The problem beside this file is a verbatim copy of
bench/kernelbench/problems/level1/47_Sum_reduction_over_a_dimension.py; only sizes change here. The
hidden shapes give every size global small, odd values: every reduce_dim: inner=129 takes two column
blocks, dim1=70 three row steps, and reducing the last dim (inner=1) over 5000 takes two
BLOCK_R=4096 steps.
"""

CPU_PUBLIC_SHAPES = [{'batch_size': 3, 'dim1': 40, 'dim2': 33, 'reduce_dim': 1}]
CPU_HIDDEN_SHAPES = [
    {'batch_size': 1, 'dim1': 1, 'dim2': 1, 'reduce_dim': 1},
    {'batch_size': 2, 'dim1': 70, 'dim2': 129, 'reduce_dim': 1},
    {'batch_size': 3, 'dim1': 5, 'dim2': 7, 'reduce_dim': 0},
    {'batch_size': 2, 'dim1': 6, 'dim2': 5000, 'reduce_dim': 2},
]
