"""Module passes, one per file; ``pipeline.py`` chains them."""

from tilework.transform.pipeline import FunctionPass, Pass, Pipeline

__all__ = ["Pass", "FunctionPass", "Pipeline"]
