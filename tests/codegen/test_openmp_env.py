"""How tilework sets up libgomp when it is imported (``tilework.codegen.c.module._load_openmp``):
a short ``GOMP_SPINCOUNT`` and, while libgomp reads its environment only, the active wait
policy (whose throttled spin keeps a model run from a second thread at full speed), each only
where the user set none. Checked in fresh processes, through libgomp's own report of what it
read (``OMP_DISPLAY_ENV``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = "import os, tilework; print('after:', os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"


def _run(**env: str) -> tuple[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_DISPLAY_ENV")}
    done = subprocess.run([sys.executable, "-c", PROBE], env={**base, "OMP_DISPLAY_ENV": "verbose", **env}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    read = " ".join(line.strip() for line in done.stderr.splitlines() if line.strip().startswith(("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")))
    return read, done.stdout.strip()


@pytest.mark.slow
def test_libgomp_reads_the_active_policy_and_the_process_keeps_none() -> None:
    read, after = _run()
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in read and "GOMP_SPINCOUNT = '20000'" in read
    assert after == "after: None 20000"  # the policy was there only while libgomp loaded


@pytest.mark.slow
def test_the_users_settings_win() -> None:
    read, after = _run(OMP_WAIT_POLICY="passive", GOMP_SPINCOUNT="300")
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in read and "GOMP_SPINCOUNT = '300'" in read
    assert after == "after: passive 300"
