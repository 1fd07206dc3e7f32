"""CPU-sized shapes for KernelBench level 2 76_Gemm_Add_ReLU (Triton interpreter).

The problem beside this file is a verbatim copy of
bench/kernelbench/problems/level2/76_Gemm_Add_ReLU.py; only sizes change here. The hidden shapes
give every size global small, odd values: batch 70 takes two BLOCK_M=64 tile rows, K=70 three
BLOCK_K=32 steps and N=130 two BLOCK_N=128 tiles. The reference's ``bias_shape = (out_features,)``
is computed again for each shape (tasks/runtime.set_globals), so the bias follows out_features.
"""

CPU_PUBLIC_SHAPES = [{'batch_size': 3, 'in_features': 40, 'out_features': 24}]
CPU_HIDDEN_SHAPES = [
    {'batch_size': 1, 'in_features': 1, 'out_features': 1},
    {'batch_size': 70, 'in_features': 70, 'out_features': 130},
    {'batch_size': 5, 'in_features': 3, 'out_features': 7},
]
