"""Hatchling build hook: compiles ffkit's Go engine and bundles it in the wheel.

The Python package runs the engine as a helper process (the Go runtime does
not survive fork(), so Go is never loaded into Python). The binary is built
from the Go module one directory above this file (or from FFKIT_GO_ROOT) and
placed at ffkit/_bin/ffkit inside the wheel, so an installed wheel needs no Go
and looks nothing up on PATH.

The Go toolchain is $GO if set, else `go` on PATH; nothing else is searched.
Without it the build stops with one line saying what to do (install Go 1.26,
or install a wheel prebuilt with `pip wheel ./python` on a machine with Go).
"""
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def _go_root(here: Path) -> Path:
    env = os.environ.get("FFKIT_GO_ROOT")
    if env:
        return Path(env).resolve()
    for d in (here.parent, here):
        if (d / "go.mod").is_file() and (d / "cmd" / "ffkit").is_dir():
            return d
    raise RuntimeError(
        f"ffkit: cannot find the Go module (go.mod with cmd/ffkit) above {here}; "
        "build the wheel from a checkout of the ffkit repository, or set FFKIT_GO_ROOT"
    )


NO_GO = (
    "ffkit: building the Python package needs Go 1.26 or later ($GO or `go` on PATH): install Go "
    "(https://go.dev/dl/), or on a machine with Go run `pip wheel ./python -w wheels/` and here "
    "`pip install wheels/ffkit-*.whl`"
)


class GoMissing(SystemExit):
    """Ends the build with one line (SystemExit prints no traceback)."""


def _go() -> str:
    env = os.environ.get("GO")
    if env:
        found = shutil.which(env)
        if found is None:
            raise GoMissing(f"{NO_GO} ($GO={env} is not an executable)")
        return found
    found = shutil.which("go")
    if found is None:
        raise GoMissing(NO_GO)
    return found


class GoEngineHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version, build_data):
        if self.target_name != "wheel":
            return
        here = Path(self.root).resolve()
        root = _go_root(here)
        out_dir = here / "build" / "engine"
        out_dir.mkdir(parents=True, exist_ok=True)
        out = out_dir / "ffkit"
        cmd = [_go(), "build", "-trimpath", "-o", str(out), "./cmd/ffkit"]
        self.app.display_info(f"ffkit: building the Go engine: {' '.join(cmd)} (in {root})")
        res = subprocess.run(cmd, cwd=root)
        if res.returncode != 0:
            raise GoMissing(f"ffkit: `{' '.join(cmd)}` failed (exit {res.returncode}; its errors are above); "
                            "Go 1.26 or later is needed")
        os.chmod(out, 0o755)
        build_data["force_include"][str(out)] = "ffkit/_bin/ffkit"
        # The wheel holds a native binary: tag it for this platform, any
        # Python 3 (no extension module, so no ABI tag).
        plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        build_data["pure_python"] = False
        build_data["tag"] = f"py3-none-{plat}"
