"""CPU-sized shapes for KernelBench level 1 41_Max_Pooling_1D (Triton interpreter).

The problem beside this file is a verbatim copy of
bench/kernelbench/problems/level1/41_Max_Pooling_1D.py; only sizes change here. Dynamo specialises
the sequence length although every size is marked dynamic (the pooling's dilation and padding):
on the H200 the start's dynamic code gave an output of the example's length at every other length.
"""

CPU_PUBLIC_SHAPES = [{'batch_size': 2, 'features': 3, 'sequence_length': 64, 'kernel_size': 8, 'stride': 1, 'padding': 4,
                      'dilation': 3}]
CPU_HIDDEN_SHAPES = [
    {'batch_size': 1, 'features': 3, 'sequence_length': 64, 'kernel_size': 8, 'stride': 1, 'padding': 4, 'dilation': 3},
    {'batch_size': 3, 'features': 5, 'sequence_length': 49, 'kernel_size': 8, 'stride': 1, 'padding': 4, 'dilation': 3},
]
