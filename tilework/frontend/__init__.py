"""Frontends: programs of other frameworks as tilework IRModules.

- ``tilework.frontend.torch``: ``torch.export`` programs (``from_exported_program``); dynamic
  ``Dim``s become sym vars with their ranges as bounds.
- ``tilework.frontend.onnx``: ONNX graphs.

Each frontend imports its framework lazily: importing ``tilework`` never imports torch or onnx.
"""
