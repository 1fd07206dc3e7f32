"""bench/gpu_busy.py: nvidia-smi's samples averaged over each phase h200.sh marked, samples
outside every phase and malformed lines left out."""

from __future__ import annotations

from bench_helpers import bench_script


def test_each_phase_averages_the_samples_inside_its_span(tmp_path, capsys, monkeypatch):
    smi = tmp_path / "smi.log"
    smi.write_text("\n".join([
        "2026/12/06 19:00:00.100, 90 %, 80 %",  # before any phase
        "2026/12/06 19:00:01.100, 20 %, 10 %",
        "2026/12/06 19:00:01.600, 40 %, 30 %",
        "2026/12/06 19:00:02.100, 60 %, 50 %",
        "No devices were found",
        "2026/12/06 19:00:03.100, 0 %, 0 %",
        "2026/12/06 19:00:04.100, 100 %, 70 %",
    ]))
    phases = tmp_path / "phases.log"
    phases.write_text("start a 19:00:01\nend a 19:00:02\nstart b 19:00:04\nend b 19:00:04\nstart c 19:00:05\n")
    bench = bench_script("gpu_busy")
    monkeypatch.setattr("sys.argv", ["gpu_busy.py", str(smi), str(phases), "--seconds", "a"])
    bench.main()
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in out[1:] if not line.startswith(" ")}
    assert rows["a"][1:] == ["1", "3", "40", "30"], out
    assert rows["b"][1:] == ["0", "1", "100", "70"], out
    assert "c" not in rows, "a phase never ended has no span"
    assert any(line.strip().startswith("00:01:30 00:02:60") for line in out), out
