"""bench/compile_keys.py on the CPU (meta tensors, no launch): the rms_norm seed's launches at
its public and hidden GPU shapes, counted by block size and the integers' divisibility."""

from __future__ import annotations

from bench_helpers import bench_script
from kernforge.tasks.loader import load_task
from kernforge.tasks.spec import Shape


def test_a_seed_s_launches_are_counted_by_block_size_and_divisibility():
    bench = bench_script("compile_keys")
    task = load_task("rms_norm")
    model_class = bench._seed_class(task)
    # H=4096 and H=8192: two block sizes; T does not reach the kernel's arguments
    small, large = (bench.keys_at(task, model_class, Shape.of({"T": t, "H": h})) for t, h in ((1, 4096), (16384, 8192)))
    assert len(small) == len(large) == 1 and small != large
    assert bench.keys_at(task, model_class, Shape.of({"T": 7, "H": 4096})) == small
    # H=3000 is no multiple of 16: its integers specialise apart from H=4096's, in the same block
    assert bench.keys_at(task, model_class, Shape.of({"T": 7, "H": 3000})) != small
    row = bench.count("rms_norm")
    assert row["public"] == 2 and row["hidden"] >= row["only_hidden"] >= 1 and 0 < row["ahead_share"] < 1
