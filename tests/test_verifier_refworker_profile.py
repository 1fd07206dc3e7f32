"""The reference worker's profile for bench/ (``KERNFORGE_REFWORKER_PROFILE``): Python's, or
torch.profiler's with each request a range, written at every verdict's end. Never set in a run."""

from __future__ import annotations

import json

import pytest

from kernforge.tasks.loader import load_task



@pytest.mark.parametrize("kind", ["cprofile", "torch"])
def test_each_verdict_of_a_profiled_reference_worker_leaves_its_record(tmp_path, monkeypatch, kind):
    from kernforge.loop.evaluate import open_judge
    from kernforge.verifier.judge import JudgeOptions
    from kernforge.verifier.refworker import PROFILE_ENV, PROFILER_ENV

    monkeypatch.setenv(PROFILE_ENV, str(tmp_path))
    monkeypatch.setenv(PROFILER_ENV, kind)
    task = load_task("rms_norm")  # its seed, on the interpreter
    with open_judge("cpu", pool_size=1, options=JudgeOptions(cache_dir=tmp_path / "cache")) as judge:
        for _ in range(2):
            assert judge.verify(task.seed_source, task).accepted
    if kind == "cprofile":
        assert len(list(tmp_path.glob("refworker-*.prof"))) == 1  # one record, rewritten at each verdict's end
        return
    tables = sorted(tmp_path.glob("refworker-*.torch.txt"))
    assert [p.name.rsplit("-", 1)[1] for p in tables] == ["1.torch.txt", "2.torch.txt"]  # one per verdict
    for table in tables:
        rows = json.loads(table.with_suffix(".json").read_text())
        assert rows["ref.compare"]["count"] > 0 and rows["ref.prepare"]["cpu_us"] > 0, sorted(rows)[:20]
        assert "ref.compare" in table.read_text()
    # bench/refworker_profile.py sums the verdicts' records per request
    from bench_helpers import bench_script

    summary = bench_script("refworker_profile")
    merged = summary.merged(tmp_path)
    table = {name: (n, host) for name, n, host, _, _ in summary.requests_table(merged)}
    one = json.loads(tables[0].with_suffix(".json").read_text())["ref.compare"]["count"]
    assert table["ref.compare"][0] == 2 * one and table["ref.compare"][1] > 0
