"""cli.py: a command line refuses an NVIDIA machine whose driver torch cannot use; a long command
says where it is off a terminal (Progress); an interrupted one exits 130, never 134."""
import dataclasses
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from runtime import cli

ROOT = Path(__file__).resolve().parent.parent

DRIVER_LINE = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"


@pytest.fixture
def driver(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "version"
    path.write_text(DRIVER_LINE)
    return path


def test_no_driver_is_a_cpu_machine(tmp_path):
    assert cli.cuda_problem(tmp_path / "absent") is None


def test_a_driver_too_old_for_torchs_cuda_is_named_with_the_fix(driver, monkeypatch):
    monkeypatch.setattr(torch, "version", types.SimpleNamespace(cuda="13.0"))
    problem = cli.cuda_problem(driver)
    assert "driver (550.54.15)" in problem and "CUDA 13.0, which needs driver 580 or newer" in problem
    assert "\n" not in problem and "CUDA_VISIBLE_DEVICES=" in problem


def test_a_cpu_torch_on_a_gpu_machine_is_named(driver, monkeypatch):
    monkeypatch.setattr(torch, "version", types.SimpleNamespace(cuda=None))
    assert "is a CPU build" in cli.cuda_problem(driver)


def test_hidden_gpus_and_working_cuda_are_not_problems(driver, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert cli.cuda_problem(driver) is None
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cli.cuda_problem(driver) is None


def test_parse_exits_with_the_line(driver, monkeypatch, capsys):
    @dataclasses.dataclass
    class Args:
        """a command"""
        steps: int = cli.flag(3, "steps")

    monkeypatch.setattr(cli, "NVIDIA_DRIVER_FILE", driver)
    monkeypatch.setattr(torch, "version", types.SimpleNamespace(cuda="13.0"))
    with pytest.raises(SystemExit) as e:
        cli.parse(Args, ["--steps", "4"])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("error: an NVIDIA driver (550.54.15) is present")


def test_no_progress_bars_where_stderr_is_not_a_terminal(monkeypatch):
    # into a log or a pipe a bar is control characters: off there, the libraries' too (their switch)
    import io
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert cli.progress_bars() is False and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS")
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert cli.progress_bars() is True and "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ


def test_a_ctrl_c_while_a_command_loads_is_one_line(tmp_path):
    # runtime/cli.py, imported first by a command, prints a Ctrl-C that no main() caught as one line
    script = tmp_path / "slow_to_load.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom runtime import cli\n"
                      "raise KeyboardInterrupt  # as if it came during the imports below\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert r.stderr.strip().splitlines() == ["slow_to_load.py: interrupted"] and r.returncode != 0


def test_progress_off_a_terminal_is_a_line_at_the_interval_with_the_time_left(monkeypatch, capsys):
    # a log gets no bar (control characters) but a plain line every interval while the work goes on:
    # before the first unit the start-up estimate counts down, after it the units' own pace
    monkeypatch.setenv("GPU_FORECASTERS_PROGRESS_S", "0.05")
    progress = cli.Progress("train", 4, "steps", expected_s=60)
    assert progress.bar is None
    time.sleep(0.3)
    progress.update()
    time.sleep(0.3)
    progress.set_words("reward 0.5")
    progress.update(2)
    time.sleep(0.3)
    progress.close()
    lines = capsys.readouterr().err.splitlines()
    assert "\r" not in "".join(lines) and len(lines) >= 6
    assert lines[0] == "train: 0 of 4 steps, 0 s in, about 60 s left (the start-up estimate)"
    paced = [x for x in lines[:-1] if x.startswith("train: 3 of 4 steps")]
    assert paced and all(x.endswith("; reward 0.5") and "start-up" not in x for x in paced)
    assert "left" in paced[0] or "slower than" in paced[0]
    assert lines[-1].startswith("train: 3 of 4 steps in ")  # the last line: where it ended
    progress.close()  # twice is once
    assert capsys.readouterr().err == ""


def test_progress_counts_work_done_elsewhere_and_leaves_instant_units_out_of_the_pace(monkeypatch, capsys):
    monkeypatch.setenv("GPU_FORECASTERS_PROGRESS_S", "3600")  # no line of its own in this test
    done = [0]
    progress = cli.Progress("demo", 10, "steps", count=lambda: done[0])
    done[0] = 4
    progress.refresh()
    assert progress.done == 4
    warm = cli.Progress("GRPO", 3, "steps", expected_s=3600, pace_from_start=True)  # nothing loads in step 1
    time.sleep(0.2)
    warm.update()
    assert "start-up" not in warm.line() and "left" in warm.line()
    time.sleep(0.5)  # the second step takes longer than the first: the time left shrinks, then says so
    assert re.search(r"slower than the \d+ s a step so far$", warm.line())
    warm.close()
    replayed = cli.Progress("search", 10, "measurements", expected_s=30)
    replayed.update(5, instant=True)  # answered from the log: no time, no pace
    assert "(the start-up estimate)" in replayed.line() and replayed.line().startswith("search: 5 of 10")
    for p in (progress, replayed):
        p.close()
    assert capsys.readouterr().err == ""  # no line was due, so no last line either


def test_progress_on_a_terminal_is_a_bar_and_no_lines(monkeypatch):
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.setattr(sys, "stderr", Terminal())
    monkeypatch.setenv("GPU_FORECASTERS_PROGRESS_S", "0.01")
    progress = cli.Progress("GRPO", 3, "steps")
    assert progress.bar is not None and progress._thread is None
    progress.update()
    progress.close()
    assert "\r" in sys.stderr.getvalue() and "GRPO: 1 of 3" not in sys.stderr.getvalue()
    assert [cli.duration(s) for s in (4, 89.6, 600, 7200)] == ["4 s", "90 s", "10.0 min", "2.0 h"]


DAEMON_IN_TORCH = """import sys, threading, time
sys.path.insert(0, {root!r})
from runtime import cli
import torch
torch.set_num_threads(1)
a = torch.randn(300, 300)
def work():
    while True:
        a @ a
for _ in range(2):
    threading.Thread(target=work, daemon=True).start()
time.sleep(0.5)
print("interrupted", file=sys.stderr)
{exit}
"""


def test_an_interrupted_exit_with_a_thread_in_native_code_is_130_and_no_abort(tmp_path):
    # Python's teardown stops a daemon thread that is inside torch by unwinding its stack, which a
    # C++ frame may forbid: "terminate called without an active exception", exit 134 (a search
    # interrupted while a measurement or a forward pass runs in another thread). exit_interrupted
    # runs the exit handlers and ends the process without that teardown.
    script = tmp_path / "stopped.py"
    script.write_text(DAEMON_IN_TORCH.format(root=str(ROOT), exit="cli.exit_interrupted(130)"))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 130 and r.stderr.strip() == "interrupted", (r.returncode, r.stderr[-500:])
