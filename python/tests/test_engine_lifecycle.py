"""The engine helper lives and dies with its Python process.

Each test waits for conditions with a generous deadline (the machine may be
loaded); none asserts on time.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ffkit
from ffkit import _engine
from ffkit.ffrecord import FileReader, FileWriter

DEADLINE = 120  # seconds: generous, only reached on failure


def _gone(pid):
    """True when pid no longer runs (gone, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def _wait(cond, what):
    end = time.monotonic() + DEADLINE
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"timed out after {DEADLINE}s waiting for {what}")
        time.sleep(0.05)


def _env():
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(ffkit.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    return env


def _start(script, *args):
    """Runs script in a fresh Python; returns the process once it printed
    its first line (a dict of pids etc.)."""
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *map(str, args)], env=_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line:
        p.wait()
        pytest.fail(f"the child Python failed: {p.stderr.read()}")
    return p, eval(line)


def test_engine_stdio_is_dev_null(gen, tmp_path):
    path, n = gen
    FileReader(path).read([0])
    pid = _engine.get().proc.pid
    for fd in (0, 1, 2):
        assert os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/null", fd
    # FFKIT_ENGINE_LOG sends its stderr to a file instead.
    log = tmp_path / "engine.log"
    p, info = _start("""
        import os, sys
        from ffkit import _engine
        e = _engine.get()
        print({"engine": e.proc.pid, "fds": [os.readlink(f"/proc/{e.proc.pid}/fd/{i}") for i in (1, 2)]}, flush=True)
    """)
    p.wait(timeout=DEADLINE)
    assert info["fds"] == ["/dev/null", "/dev/null"]
    env = _env()
    env["FFKIT_ENGINE_LOG"] = str(log)
    out = subprocess.run([sys.executable, "-c", "import os; from ffkit import _engine; e = _engine.get(); "
                          "print(os.readlink(f'/proc/{e.proc.pid}/fd/2'))"], env=env, capture_output=True, text=True,
                         timeout=DEADLINE)
    assert out.stdout.strip() == str(log), out.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_engine_stops_on_signal_and_python_starts_a_fresh_one(gen, sig):
    path, n = gen
    r = FileReader(path)
    first = r.read([0])[0].tobytes()
    e = _engine.get()
    old = e.proc.pid
    os.kill(old, sig)
    e.proc.wait(timeout=DEADLINE)  # before: SIGINT was ignored
    # The next request finds the helper gone and starts another.
    assert r.read([0])[0].tobytes() == first
    assert _engine.get().proc.pid != old


# A child Python that starts the engine, forks a process the way a C
# extension does (libc fork: no Python at-fork hooks, so the child keeps the
# engine's control socket open), then works with the engine until killed.
_WORKER = """
    import ctypes, os, sys, threading, time
    import numpy as np
    from ffkit import _engine
    from ffkit.ffrecord import FileReader, FileWriter
    mode, path = sys.argv[1], sys.argv[2]
    e = _engine.get()
    libc = ctypes.CDLL(None)
    holder = libc.fork()
    if holder == 0:
        time.sleep(600)
        os._exit(0)
    if mode == "read":
        r = FileReader(path)
        r.read([0])
        def loop():
            while True:
                r.read(list(range(r.n)))
        for _ in range(2):
            threading.Thread(target=loop, daemon=True).start()
        print({"engine": e.proc.pid, "holder": holder}, flush=True)
        time.sleep(600)
    else:
        w = FileWriter(path, 10**6)
        w.write_one(b"first")
        big = np.full(64 << 20, 7, dtype=np.uint8)
        print({"engine": e.proc.pid, "holder": holder}, flush=True)
        while True:
            w.write_one(big)  # streamed to the engine until the kill
"""


@pytest.mark.parametrize("mode", ["read", "write"])
def test_kill_9_python_mid_request_leaves_no_engine(gen, tmp_path, mode):
    path, n = gen
    target = tmp_path / "out.ffr"
    p, info = _start(_WORKER, mode, path if mode == "read" else target)
    try:
        assert not _gone(info["engine"])
        p.kill()  # SIGKILL: no atexit, no cleanup in Python
        p.wait(timeout=DEADLINE)
        # Before: the forked holder kept the control socket open, so the
        # engine served on for ever.
        _wait(lambda: _gone(info["engine"]), f"engine {info['engine']} to exit after its parent was killed")
    finally:
        try:
            os.kill(info["holder"], signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.stdout.close()
        p.stderr.close()
    if mode == "write":
        # Nothing half-written appears as data.
        assert not target.exists()
        assert [q.name for q in tmp_path.iterdir()] == []
        with pytest.raises(FileNotFoundError):
            FileReader(target)
