"""CPU-sized shapes for KernelBench level 2 59_Matmul_Swish_Scaling (Triton interpreter).

The problem beside this file is a verbatim copy of
bench/kernelbench/problems/level2/59_Matmul_Swish_Scaling.py; only sizes change here. The hidden
shapes give every size global small, odd values: 70 x 129 outputs take 2 x 2 tiles of 64 x 128, and
K=70 three BLOCK_K=32 steps, all masked.
"""

CPU_PUBLIC_SHAPES = [{'batch_size': 33, 'in_features': 40, 'out_features': 65}]
CPU_HIDDEN_SHAPES = [
    {'batch_size': 1, 'in_features': 1, 'out_features': 1},
    {'batch_size': 70, 'in_features': 70, 'out_features': 129},
    {'batch_size': 5, 'in_features': 3, 'out_features': 7},
]
