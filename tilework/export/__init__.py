"""Ahead-of-time export: a compiled model as a standalone C library (``docs/export.md``)."""

from tilework.export.aot import ExportResult, build_export, export_c
from tilework.export.externs import ExportError

__all__ = ["ExportError", "ExportResult", "build_export", "export_c"]
