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


def test_the_hosts_cores_are_averaged_per_phase_beside_the_gpu(tmp_path, capsys, monkeypatch):
    smi = tmp_path / "smi.log"
    smi.write_text("2026/12/06 19:00:01.100, 20 %, 10 %\n2026/12/06 19:00:02.100, 60 %, 50 %\n")
    cpu = tmp_path / "cpu.log"
    cpu.write_text("19:00:00 99 40 16\n19:00:01 50 3 16\n19:00:02 100 9 16\nnot a sample\n19:00:02 x 1 16\n")
    phases = tmp_path / "phases.log"
    phases.write_text("start a 19:00:01\nend a 19:00:02\n")
    bench = bench_script("gpu_busy")
    monkeypatch.setattr("sys.argv", ["gpu_busy.py", str(smi), str(phases), "--cpu", str(cpu)])
    bench.main()
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[-6:] == ["CPU", "busy", "%", "max", "runnable", "max"], out
    assert out[1].split() == ["a", "1", "2", "40", "30", "75", "100", "6.0", "9"], out


def test_a_cpu_sample_is_the_busy_share_between_two_reads_of_proc_stat():
    sample = bench_script("cpu_sample")
    first = sample.read_stat("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4 5\nprocs_running 3\n")
    assert first == (150, 1000, 3)
    # 100 jiffies later: 60 user, 10 system, 20 idle, 10 iowait; 7 threads runnable
    second = sample.read_stat("cpu  160 0 60 820 60 0 0 0 0 0\nprocs_running 7\n")
    assert second == (220, 1100, 7)
    assert sample.line(0.0, first, second, 16).split()[1:] == ["70", "7", "16"]
    assert sample.line(0.0, second, second, 16).split()[1:] == ["0", "7", "16"], "no time between reads: nothing busy"
