"""The C side of ``tilework.runtime.team``: ``team.c`` compiled once into the kernel cache, with
the kernels' OpenMP flags, and installed into the runtime when the first C kernel library
loads (where no C compiler is found and the cache lacks it, nothing is installed: calls run as
they did)."""

from __future__ import annotations

import ctypes
import functools
from importlib import resources

from tilework.codegen import cache
from tilework.codegen.c import toolchain
from tilework.errors import BuildError
from tilework.runtime import team


@functools.cache
def install() -> bool:
    """Build (or find) the team library and give its functions to ``tilework.runtime.team``;
    True if installed."""
    if not team.enabled():
        return False
    try:
        built = toolchain.compile_source(resources.files("tilework.codegen.c").joinpath("team.c").read_text())
        lib = cache.load_shared_object(built.path, built.data)
    except (BuildError, OSError):
        return False
    lib.tw_team_hold.restype = ctypes.c_int
    lib.tw_team_hold.argtypes = []
    lib.tw_team_release.restype = None
    lib.tw_team_release.argtypes = []
    team.install(lib.tw_team_hold, lib.tw_team_release)
    return True
