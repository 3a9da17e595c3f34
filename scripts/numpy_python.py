"""A script that needs numpy under a python3 without it (a pyenv shim, as
CMake may find) runs itself again with the system python3, which `make deps`
gives python3-numpy."""

import os
import subprocess
import sys


def ensure_numpy(tool):
    """Returns when numpy imports; else re-executes the running script with
    a python3 that has it, or exits naming `tool`."""
    try:
        import numpy  # noqa: F401
        return
    except ImportError:
        pass
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and os.path.realpath(candidate) != os.path.realpath(
                sys.executable) and subprocess.run(
                    [candidate, "-c", "import numpy"], capture_output=True).returncode == 0:
            os.execv(candidate, [candidate] + sys.argv)
    sys.exit(f"{tool}: no python3 with numpy (make deps installs python3-numpy)")
