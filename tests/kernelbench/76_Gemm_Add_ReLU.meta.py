"""CPU-sized shapes for KernelBench level 2 76_Gemm_Add_ReLU (Triton interpreter).

The problem beside this file is a verbatim copy of
bench/kernelbench/problems/level2/76_Gemm_Add_ReLU.py; only sizes change here. The hidden shapes
give every size global small, odd values: batch 70 takes two BLOCK_M=64 tile rows and K=70 three
BLOCK_K=32 steps; out_features stays 8192 because the reference derives bias_shape from it at
import.
"""

CPU_PUBLIC_SHAPES = [{'batch_size': 3, 'in_features': 40}]
CPU_HIDDEN_SHAPES = [
    {'batch_size': 1, 'in_features': 1},
    {'batch_size': 70, 'in_features': 70},
    {'batch_size': 5, 'in_features': 3},
]
