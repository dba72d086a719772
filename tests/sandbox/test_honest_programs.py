"""Honest programs of many shapes pass in the sandbox (docs/explanation/sandbox.md): processes and threads,
the allowed packages, deep recursion, files, output, memory, sockets, and the shapes a model
writes around a right function (its own source read back, a ``__main__`` block that reads stdin,
runs unittest or exits 0). All 38 run together in one ``run_many`` batch; each is one case."""
from __future__ import annotations

import pytest

import subprocess
import sys

from pytest_redline.suites.code import MBPP
from pytest_redline.suites.sandbox import Limits, Program, cgroup, jail, run_many

pytestmark = pytest.mark.slow  # bubblewrap jails: 38 programs, about 10 s of 2 loaded CPUs

LAYOUT = cgroup.layout()
TCP_CHARGED = isinstance(LAYOUT, cgroup.Layout) and LAYOUT.tcp
# Each shape: its program and its tests (both run as __main__, the tests after the program).
SHAPES: dict[str, tuple[str, str]] = {
    "fork pool": ("import multiprocessing as mp\nwith mp.get_context('fork').Pool(2) as pool:\n"
                  "    got = pool.map(abs, [-1, -2, 3])\n", "assert got == [1, 2, 3]\n"),
    "spawn pool": ("import math, multiprocessing as mp\nwith mp.get_context('spawn').Pool(2) as pool:\n"
                   "    got = pool.map(math.factorial, [3, 4])\n", "assert got == [6, 24]\n"),
    "forkserver pool": ("import multiprocessing as mp\nwith mp.get_context('forkserver').Pool(1) as pool:\n"
                        "    got = pool.map(len, ['ab', 'abc'])\n", "assert got == [2, 3]\n"),
    "manager": ("import multiprocessing as mp\nwith mp.Manager() as manager:\n    shared = manager.dict(a=1)\n"
                "    shared['b'] = 2\n    got = dict(shared)\n", "assert got == {'a': 1, 'b': 2}\n"),
    "queue between processes": (
        "import multiprocessing as mp\ndef produce(queue):\n    queue.put(sum(range(10)))\n"
        "queue = mp.Queue()\nworker = mp.get_context('fork').Process(target=produce, args=(queue,))\n"
        "worker.start()\ngot = queue.get(timeout=20)\nworker.join()\n", "assert got == 45\n"),
    "process pool executor": ("from concurrent.futures import ProcessPoolExecutor\n"
                              "with ProcessPoolExecutor(2) as pool:\n    got = list(pool.map(pow, [2, 3], [3, 2]))\n",
                              "assert got == [8, 9]\n"),
    "32 threads": ("import threading\nbarrier = threading.Barrier(32)\nseen = []\n"
                   "def meet(i):\n    barrier.wait(20)\n    seen.append(i)\n"
                   "threads = [threading.Thread(target=meet, args=(i,)) for i in range(32)]\n"
                   "[t.start() for t in threads]\n[t.join() for t in threads]\n", "assert sorted(seen) == list(range(32))\n"),
    "60 threads": ("import threading\nbarrier = threading.Barrier(60)\nthreads = [threading.Thread(target=barrier.wait, args=(20,))"
                   " for _ in range(60)]\n[t.start() for t in threads]\n[t.join() for t in threads]\n",
                   "assert barrier.n_waiting == 0 and not barrier.broken\n"),
    "default thread pool": ("from concurrent.futures import ThreadPoolExecutor\nwith ThreadPoolExecutor() as pool:\n"
                            "    got = sum(pool.map(lambda n: n * n, range(1000)))\n", "assert got == 332833500\n"),
    "numpy": ("import numpy as np\nm = np.arange(9.0).reshape(3, 3)\ntrace = float(np.trace(m @ m.T))\n",
              "assert trace == 204.0\n"),
    "scipy": ("from scipy import integrate\narea = integrate.quad(lambda x: x * x, 0, 3)[0]\n",
              "assert abs(area - 9.0) < 1e-9\n"),
    "200k-deep recursion": ("import sys\nsys.setrecursionlimit(250_000)\ndef depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n",
                            "assert depth(200_000) == 200_000\n"),
    "stdin at EOF": ("import sys\ndata = sys.stdin.read()\n", "assert data == ''\n"),
    "files in the work folder": ("with open('notes.txt', 'w') as f:\n    f.write('kept')\n",
                                 "assert open('notes.txt').read() == 'kept'\n"),
    "files in /tmp": ("import tempfile\nwith tempfile.NamedTemporaryFile('w+', delete=False) as f:\n    f.write('x' * 100)\n"
                      "path = f.name\n", "assert path.startswith('/tmp/') and len(open(path).read()) == 100\n"),
    "a subprocess": ("import subprocess, sys\nout = subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True,"
                     " text=True).stdout\n", "assert out == '42\\n'\n"),
    "a shell command": ("import subprocess\nout = subprocess.check_output('echo $((2 + 3))', shell=True)\n",
                        "assert out == b'5\\n'\n"),
    "signals": ("import signal, os\ngot = []\nsignal.signal(signal.SIGUSR1, lambda *a: got.append('usr1'))\n"
                "os.kill(os.getpid(), signal.SIGUSR1)\nsignal.alarm(0)\n", "assert got == ['usr1']\n"),
    "unicode": ("word = 'naïve café ☕ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢'\nprint(word)\n", "assert len(word) == 20 and word.upper().startswith('NAÏVE')\n"),
    "a short sleep": ("import time\nstart = time.monotonic()\ntime.sleep(0.2)\n", "assert time.monotonic() - start >= 0.2\n"),
    "50 MiB of output": ("import sys\nline = 'y' * 1023 + '\\n'\nfor _ in range(50 * 1024):\n    sys.stdout.write(line)\n", "pass\n"),
    "heavy heapq": ("import heapq, random\nrandom.seed(1)\nitems = [random.random() for _ in range(300_000)]\n"
                    "smallest = heapq.nsmallest(5, items)\nheapq.heapify(items)\n",
                    "assert smallest == sorted(smallest) and heapq.heappop(items) == smallest[0]\n"),
    "heavy itertools": ("import itertools\ncount = sum(1 for _ in itertools.permutations(range(9)))\n",
                        "assert count == 362880\n"),
    "a big regular expression": ("import re\nwords = [f'w{i}x' for i in range(5000)]\npattern = re.compile('|'.join(words))\n",
                                 "assert pattern.fullmatch('w4999x') and not pattern.fullmatch('w5000x')\n"),
    "600 MB of memory": ("block = bytearray(600_000_000)\nblock[-1] = 7\n", "assert block[-1] == 7 and len(block) == 600_000_000\n"),
    "sqlite": ("import sqlite3\ndb = sqlite3.connect('t.db')\ndb.execute('create table t (x)')\n"
               "db.executemany('insert into t values (?)', [(i,) for i in range(100)])\ndb.commit()\n",
               "assert db.execute('select sum(x) from t').fetchone() == (4950,)\n"),
    "asyncio": ("import asyncio\nasync def twice(n):\n    await asyncio.sleep(0.01)\n    return 2 * n\n"
                "async def main():\n    return await asyncio.gather(*(twice(n) for n in range(5)))\n"
                "got = asyncio.run(main())\n", "assert got == [0, 2, 4, 6, 8]\n"),
    "shared memory": ("from multiprocessing import shared_memory\nblock = shared_memory.SharedMemory(create=True, size=1 << 20)\n"
                      "block.buf[0] = 9\n", "assert block.buf[0] == 9\nblock.close()\nblock.unlink()\n"),
    "user and host names": ("import getpass, socket\nuser = getpass.getuser()\nhost = socket.getaddrinfo('localhost', 80)[0][4][0]\n",
                            "assert user == 'sandbox' and host in ('127.0.0.1', '::1')\n"),
    "Unix socket pair": ("import socket\nleft, right = socket.socketpair()\nleft.sendall(b'hi')\ngot = right.recv(2)\n",
                         "assert got == b'hi'\n"),
    "decimal and fractions": ("from decimal import Decimal, getcontext\nfrom fractions import Fraction\ngetcontext().prec = 50\n"
                              "third = Decimal(1) / Decimal(3)\nharmonic = sum(Fraction(1, n) for n in range(1, 200))\n",
                              "assert str(third).startswith('0.3333') and harmonic.denominator > 10 ** 80\n"),
    "memoised recursion": ("import functools\n@functools.lru_cache(None)\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
                           "assert fib(90) == 2880067194370816120 and fib(400) % 10 ** 6 == 19675\n"),
    "its own source": ("import inspect\ndef add(a, b):\n    return a + b\nsource = inspect.getsource(add)\n",
                       "assert source == 'def add(a, b):\\n    return a + b\\n' and add(2, 3) == 5\n"),
    "a forked child that returns": ("import os\nif os.fork() == 0:\n    pass\nelse:\n    os.wait()\ndef add(a, b):\n    return a + b\n",
                                    "assert add(2, 3) == 5\n"),
}
# MBPP completions that end in a __main__ block, assembled by the suite (task 11: remove_Occ).
MAIN_BLOCKS = {
    "__main__ reads stdin": "if __name__ == '__main__':\n    s, ch = input().split()\n    print(remove_Occ(s, ch))\n",
    "__main__ runs unittest": ("import unittest\nclass T(unittest.TestCase):\n    def test(self):\n"
                               "        self.assertEqual(remove_Occ('hello', 'l'), 'heo')\n"
                               "if __name__ == '__main__':\n    unittest.main()\n"),
    "__main__ exits 0": "import sys\nif __name__ == '__main__':\n    print(remove_Occ('hello', 'l'))\n    sys.exit(0)\n",
}
if TCP_CHARGED:
    SHAPES["loopback TCP"] = ("import socket, threading\nserver = socket.create_server(('127.0.0.1', 0))\n"
                              "def echo():\n    peer = server.accept()[0]\n    peer.sendall(peer.recv(4) * 2)\n"
                              "threading.Thread(target=echo).start()\nclient = socket.create_connection(server.getsockname())\n"
                              "client.sendall(b'ping')\ngot = client.recv(8)\n", "assert got == b'pingping'\n")
else:  # inet sockets are refused here (no cgroup charges TCP buffers): a zlib round trip instead
    SHAPES["zlib"] = ("import zlib\ndata = b'abc' * 10000\npacked = zlib.compress(data)\n",
                      "assert zlib.decompress(packed) == data and len(packed) < 200\n")
CASES = [*SHAPES, *MAIN_BLOCKS]
LIMITS = Limits(cpu_seconds=10)
MBPP_SUITE = MBPP(ids=[11])


def _programs() -> list[Program]:
    programs = [Program(code, tests, LIMITS) for code, tests in SHAPES.values()]
    prompt = MBPP_SUITE.prompts()[0]
    for block in MAIN_BLOCKS.values():
        programs.append(MBPP_SUITE.program(prompt, f"```python\n{prompt.meta['code']}\n\n{block}```\n"))
    return programs


@pytest.fixture(scope="module")
def results():
    return dict(zip(CASES, run_many(_programs(), workers=2)))


def test_count_honest_shapes():
    assert len(CASES) == 38


def _own_site_packages(name: str) -> bool:
    """Whether ``name`` lies in this interpreter's own site-packages, which the jail shows (a
    worktree's venv that reaches the main venv's packages through a .pth file does not)."""
    probe = ("import importlib.util, site\nsite.venv(None)\nspec = importlib.util.find_spec(%r)\n"
             "print(spec is not None and any(spec.origin.startswith(p) for p in site.getsitepackages()))" % name)
    return subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True).stdout.strip() == "True"


@pytest.mark.parametrize("shape", CASES)
def test_pass_honest_shape_sandbox(results, shape):
    if shape in jail.ALLOWED_PACKAGES and not _own_site_packages(shape):
        pytest.skip(f"{shape} is not in {sys.executable}'s own site-packages (reached through a .pth file only)")
    result = results[shape]
    assert result.passed, (result.reason, result.output[-1500:])
