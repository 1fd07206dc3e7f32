"""CPU-sized shapes for KernelBench level 1 3_Batched_matrix_multiplication (Triton interpreter).

The problem beside this file is a verbatim copy of
bench/kernelbench/problems/level1/3_Batched_matrix_multiplication.py; only sizes change here. The
hidden shapes give every size global small, odd values: 70 x 129 outputs take 2 x 3 tiles of the
CPU's 64 x 64 and k=70 three BLOCK_K=32 steps, all masked, in each of three batches.
"""

CPU_PUBLIC_SHAPES = [{'batch_size': 2, 'm': 33, 'k': 40, 'n': 65}]
CPU_HIDDEN_SHAPES = [
    {'batch_size': 1, 'm': 1, 'k': 1, 'n': 1},
    {'batch_size': 3, 'm': 70, 'k': 70, 'n': 129},
    {'batch_size': 5, 'm': 5, 'k': 3, 'n': 7},
]
