"""Building the package without Go stops with one line saying what to do.

The build hook (python/hatch_build.py) looks for Go in $GO and on PATH only.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytest.importorskip("hatchling")


def _pip_wheel(tmp_path, **env_extra):
    bindir = Path(sys.executable).parent
    env = {"HOME": str(tmp_path), "PATH": f"{bindir}:/usr/bin:/bin", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    env.update(env_extra)
    assert shutil.which("go", path=env["PATH"]) is None, "this test needs a PATH without go"
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w",
                           str(tmp_path / "w"), str(REPO / "python")], env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("go_env", [{}, {"GO": "/nonexistent/go"}])
def test_build_without_go_says_what_to_do_in_one_line(tmp_path, go_env):
    # Before: the hook also looked in /usr/local/go/bin and /usr/lib/go/bin,
    # and a missing Go ended in a traceback.
    out = _pip_wheel(tmp_path, **go_env)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    lines = [line.strip() for line in text.splitlines() if "ffkit: building the Python package needs Go 1.26" in line]
    assert len(lines) == 1, text
    assert "pip wheel" in lines[0] and "install Go" in lines[0]
    assert "Traceback" not in text
    if go_env:
        assert "$GO=/nonexistent/go" in lines[0]
    assert not list((tmp_path / "w").glob("*.whl")) if (tmp_path / "w").exists() else True
