"""CPU-sized shapes for KernelBench level 2 56_Matmul_Sigmoid_Sum (Triton interpreter).

The problem beside this file is a verbatim copy of
bench/kernelbench/problems/level2/56_Matmul_Sigmoid_Sum.py; only sizes change here. The hidden
shapes give every size global small, odd values: 70 x 129 outputs take 2 x 2 tiles of 64 x 128, and
K=70 three BLOCK_K=32 steps, all masked.
"""

CPU_PUBLIC_SHAPES = [{'batch_size': 33, 'input_size': 40, 'hidden_size': 65}]
CPU_HIDDEN_SHAPES = [
    {'batch_size': 1, 'input_size': 1, 'hidden_size': 1},
    {'batch_size': 70, 'input_size': 70, 'hidden_size': 129},
    {'batch_size': 5, 'input_size': 3, 'hidden_size': 7},
]
