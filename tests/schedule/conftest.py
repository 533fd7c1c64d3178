"""Fixtures of the schedule tests."""

from __future__ import annotations

from typing import Iterator

import pytest

from tilework.schedule.rules import common


@pytest.fixture(params=["32x16", "64x32"], ids=["avx2", "avx512"])
def registers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The schedule rules sized for each register file (16 x 256-bit, 32 x 512-bit), whatever
    the host has: the tiles are chosen by ``TILEWORK_VECTOR_REGISTERS``."""
    monkeypatch.setenv("TILEWORK_VECTOR_REGISTERS", request.param)
    common.host_registers.cache_clear()
    yield request.param
    common.host_registers.cache_clear()
