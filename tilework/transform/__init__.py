"""Module passes, one per file; ``base.py`` defines passes and pipelines, ``pipeline.py`` the
named pipelines."""

from tilework.transform.base import FunctionPass, Pass, Pipeline

__all__ = ["Pass", "FunctionPass", "Pipeline"]
