"""A supervisor starts a fresh GPU worker only once the exited one's processes are gone
and no GPU lists them (NVML where present), within a bound."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

from omnijobs import released
from omnijobs.released import group_members, wait_released


def leader_leaving(member: str) -> subprocess.Popen:
    """A process group whose leader exits at once (as a worker exiting for a restart)
    while ``member`` (a command line, its stage process) lives on in the group."""
    leader = subprocess.Popen(
        [sys.executable, "-c",
         f"import subprocess, sys; subprocess.Popen({member.split()!r}); sys.exit(75)"],
        process_group=0)
    assert leader.wait(30) == 75
    return leader


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_the_wait_lasts_until_the_groups_last_process_is_gone():
    leader = leader_leaving("sleep 1")
    [member] = group_members(leader.pid)
    assert wait_released(leader.pid, bound_s=60)
    assert not alive(member) and group_members(leader.pid) == set()


def test_a_process_that_will_not_go_holds_the_start_only_within_the_bound(caplog):
    leader = leader_leaving("sleep 600")
    try:
        with caplog.at_level(logging.WARNING, logger="omnijobs.supervisor"):
            assert not wait_released(leader.pid, bound_s=0.5)
        assert "still run after 0.5 s; starting a fresh worker anyway" in caplog.text
    finally:
        os.killpg(leader.pid, signal.SIGKILL)


def test_with_nvml_the_wait_lasts_until_no_gpu_lists_the_groups_processes(monkeypatch):
    """The driver frees a process's memory after it is gone: NVML still lists it for a
    while (here, for three reads after the process exited)."""
    leader = leader_leaving("sleep 0.5")
    [member] = group_members(leader.pid)
    reads = []

    def running(handle):
        gone = not alive(member)
        reads.append(gone)
        listed = not gone or reads.count(True) <= 3
        return [SimpleNamespace(pid=member)] if listed else [SimpleNamespace(pid=1)]

    nvml = SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 2,
                           nvmlDeviceGetHandleByIndex=lambda i: i,
                           nvmlDeviceGetComputeRunningProcesses=running)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(released, "POLL_S", 0.05)
    assert wait_released(leader.pid, bound_s=60)
    assert reads.count(True) > 3  # it read on past the last time the member was listed
    assert released.gpu_holders()() == {1}  # a stranger's process is no reason to wait


def test_without_nvml_or_a_driver_there_is_nothing_to_read(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert released.gpu_holders() is None

    def no_driver():
        raise RuntimeError("NVML Shared Library Not Found")
    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(nvmlInit=no_driver))
    assert released.gpu_holders() is None


def test_vllms_own_copy_of_nvml_is_read_without_importing_vllm(monkeypatch, tmp_path):
    """The GPU image has NVML's binding as vLLM's vendored file; importing vllm (torch)
    in the supervisor would cost seconds at every restart."""
    package = tmp_path / "vllm"
    (package / "third_party").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('vllm itself imported')\n")
    (package / "third_party" / "pynvml.py").write_text(
        "def nvmlInit(): pass\n"
        "def nvmlDeviceGetCount(): return 1\n"
        "def nvmlDeviceGetHandleByIndex(i): return i\n"
        "class P:\n    pid = 4242\n"
        "def nvmlDeviceGetComputeRunningProcesses(h): return [P()]\n")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert released.gpu_holders()() == {4242}
    assert "vllm" not in sys.modules
