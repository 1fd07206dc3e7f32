"""CPU-sized shapes for KernelBench level 1 2_Standard_matrix_multiplication_ (Triton interpreter).

The problem beside this file is a verbatim copy of
bench/kernelbench/problems/level1/2_Standard_matrix_multiplication_.py; only sizes change here. The
hidden shapes give every size global small, odd values: 130 x 129 outputs take 2 x 2 tiles of 128 x
128 and K=70 three BLOCK_K=32 steps, all masked.
"""

CPU_PUBLIC_SHAPES = [{'M': 33, 'K': 40, 'N': 65}]
CPU_HIDDEN_SHAPES = [
    {'M': 1, 'K': 1, 'N': 1},
    {'M': 130, 'K': 70, 'N': 129},
    {'M': 5, 'K': 3, 'N': 7},
]
