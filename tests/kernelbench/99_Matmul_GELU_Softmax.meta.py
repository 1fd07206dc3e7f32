"""CPU-sized shapes for KernelBench level 2 99_Matmul_GELU_Softmax (Triton interpreter).

The problem beside this file is a verbatim copy of
bench/kernelbench/problems/level2/99_Matmul_GELU_Softmax.py; only sizes change here. The hidden
shapes give every size global small, odd values: 2 x 2 GEMM tiles with K in three steps; rows of
5000 take two softmax BLOCK=4096 steps.
"""

CPU_PUBLIC_SHAPES = [{'batch_size': 33, 'in_features': 40, 'out_features': 65}]
CPU_HIDDEN_SHAPES = [
    {'batch_size': 1, 'in_features': 1, 'out_features': 1},
    {'batch_size': 70, 'in_features': 70, 'out_features': 129},
    {'batch_size': 3, 'in_features': 5, 'out_features': 5000},
]
