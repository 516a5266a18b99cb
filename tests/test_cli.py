"""cli.py: a command line refuses an NVIDIA machine whose driver torch cannot use."""
import dataclasses
import os
import subprocess
import sys
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
