"""CPU-sized shapes for KernelBench level 1 34_InstanceNorm (Triton interpreter).

The problem beside this file is a verbatim copy of
bench/kernelbench/problems/level1/34_InstanceNorm.py; only sizes change here. Inductor returns its
output through ``reinterpret_tensor`` (the start's return statement is a view): on the H200 the
start was rejected with NameError until the return was translated like every other statement.
"""

CPU_PUBLIC_SHAPES = [{'batch_size': 2, 'features': 3, 'dim1': 8, 'dim2': 9}]
CPU_HIDDEN_SHAPES = [
    {'batch_size': 1, 'features': 1, 'dim1': 1, 'dim2': 2},
    {'batch_size': 3, 'features': 5, 'dim1': 33, 'dim2': 29},
]
