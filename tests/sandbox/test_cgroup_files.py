"""The cgroup module's files on cgroup v2, against a fake cgroup file system (a real v2 host was
not available: the development machine mounts cgroup v1, where test_sandbox_limits.py runs the
real thing). What is written, where, and how usage is read."""
from __future__ import annotations

import os

import pytest

from pytest_redline.suites.sandbox import SandboxUnavailable, cgroup, slots


def test_limits_written_v2_cgroup(tmp_path):
    layout = cgroup.Layout(2, {"unified": tmp_path})
    group = cgroup.Cgroup(layout, "slot-3", 256 << 20, 64, 1.0)
    folder = tmp_path / "slot-3"
    assert {f.name: f.read_text() for f in folder.iterdir()} == {
        "memory.max": f"{256 << 20}\n", "memory.swap.max": "0\n", "pids.max": "64\n", "cpu.max": "100000 100000\n"}
    assert group.procs() == [folder / "cgroup.procs"]
    (folder / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n")
    (folder / "cgroup.threads").write_text(f"{os.getpid()}\n")
    cpu, waited = group.usage()
    assert cpu == 1.5 and waited >= 0


def test_limits_written_v1_cgroup(tmp_path):
    parents = {c: tmp_path / c / cgroup.FOLDER for c in cgroup.V1}
    for parent in parents.values():
        parent.mkdir(parents=True)
    group = cgroup.Cgroup(cgroup.Layout(1, parents), "slot-0", 1 << 30, 16, 0.5, tcp_bytes=32 << 20)
    assert (parents["memory"] / "slot-0" / "memory.limit_in_bytes").read_text() == f"{1 << 30}\n"
    assert (parents["memory"] / "slot-0" / "memory.kmem.tcp.limit_in_bytes").read_text() == f"{32 << 20}\n"
    assert (parents["memory"] / "slot-0" / "memory.memsw.limit_in_bytes").read_text() == f"{1 << 30}\n"
    assert (parents["pids"] / "slot-0" / "pids.max").read_text() == "16\n"
    assert (parents["cpu"] / "slot-0" / "cpu.cfs_quota_us").read_text() == "50000\n"
    assert len(group.procs()) == 4
    (parents["cpuacct"] / "slot-0" / "cpuacct.usage").write_text("2500000000\n")
    (parents["pids"] / "slot-0" / "tasks").write_text("")
    assert group.usage() == (2.5, 0.0)


def test_leftover_removed_on_create_cgroup(tmp_path):
    layout = cgroup.Layout(2, {"unified": tmp_path})
    (tmp_path / "slot-1").mkdir()  # an empty leftover (a real one holds only kernel files)
    cgroup.Cgroup(layout, "slot-1", 1 << 20, 4, 1.0)
    assert (tmp_path / "slot-1" / "pids.max").read_text() == "4\n"


def test_reason_without_cgroups_cgroup(tmp_path):
    found = cgroup.layout(str(tmp_path / "nothing-mounted-here"))
    assert isinstance(found, str) and "cgroup" in found


def test_tcp_limit_only_where_charged_cgroup(tmp_path):
    # v1 charges TCP buffers only under memory.kmem.tcp.limit_in_bytes; where the knob is missing
    # the layout says so (and seccomp refuses inet sockets instead), and nothing is written.
    parents = {c: tmp_path / c / cgroup.FOLDER for c in cgroup.V1}
    for parent in parents.values():
        parent.mkdir(parents=True)
    mounts = [("cgroup", str(tmp_path / c), {c}) for c in cgroup.V1]
    own = "".join(f"{n}:{c}:/\n" for n, c in enumerate(cgroup.V1))
    found = cgroup._v1(mounts, str(tmp_path), own)
    assert isinstance(found, cgroup.Layout) and not found.tcp
    (parents["memory"] / "memory.kmem.tcp.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup._v1(mounts, str(tmp_path), own).tcp
    cgroup.Cgroup(cgroup.Layout(1, parents, tcp=False), "slot-2", 1 << 30, 16, 1.0)
    assert not (parents["memory"] / "slot-2" / "memory.kmem.tcp.limit_in_bytes").exists()


def test_named_cause_live_leftover_cgroup(tmp_path):
    # A group that cannot be removed though this gate holds its slot belongs to another gate that
    # does not share the slot locks: the refusal says so, and does not suggest the weaker sandbox.
    layout = cgroup.Layout(2, {"unified": tmp_path})
    (tmp_path / "uid-61001").mkdir()
    (tmp_path / "uid-61001" / "cgroup.procs").write_text("4242\n")  # rmdir fails: not empty
    with pytest.raises(SandboxUnavailable, match=r"another gate on this kernel .* \$REDLINE_SANDBOX_UID_BASE") as error:
        cgroup.Cgroup(layout, "uid-61001", 1 << 20, 4, 1.0)
    assert "process sandbox" not in str(error.value) and "sandbox: process" not in str(error.value)


def test_uid_base_setting_slots(monkeypatch):
    assert slots.uid_base() == slots.SLOT_UID_BASE and slots.slot_name(61003) == "uid-61003"
    monkeypatch.setenv(slots.UID_BASE_SETTING, "70000")
    assert slots.uid_base() == 70000
    for bad in ("-5", "lots", "999"):
        monkeypatch.setenv(slots.UID_BASE_SETTING, bad)
        with pytest.raises(ValueError, match=r"\$REDLINE_SANDBOX_UID_BASE: expected a uid from 1000"):
            slots.uid_base()
