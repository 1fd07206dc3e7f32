"""CPU shapes of kb_fixed_length: a hidden length other than the public one's."""

CPU_PUBLIC_SHAPES = [{'batch_size': 2, 'features': 3, 'sequence_length': 64}]
CPU_HIDDEN_SHAPES = [
    {'batch_size': 1, 'features': 3, 'sequence_length': 64},
    {'batch_size': 3, 'features': 5, 'sequence_length': 80},
]
