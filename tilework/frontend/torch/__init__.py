"""The torch frontend: ``torch.export.ExportedProgram`` -> IRModule.

    ep = torch.export.export(model, args, dynamic_shapes={"x": {1: Dim("seq", max=512)}})
    mod = from_exported_program(ep)            # main(x, *weights), attrs num_inputs = 1

See ``translator`` for the walk, ``symbolic`` for sizes, ``registry`` and the ``convert_*``
modules for the ATen converters.
"""

from __future__ import annotations

from typing import Any, Mapping

from tilework.frontend.torch.symbolic import Bounds, parse_dim_spec
from tilework.ir.module import IRModule


def from_exported_program(
    ep: Any,
    keep_params_as_inputs: bool = True,
    *,
    dim_names: Mapping[str, str] | None = None,
    dim_bounds: Mapping[str, Bounds] | None = None,
) -> IRModule:
    """The IRModule of an ExportedProgram: ``main(user tensor inputs..., weights...)`` with
    ``attrs["num_inputs"]`` user inputs, or ``main(user inputs...)`` with the weights as
    constants when ``keep_params_as_inputs`` is False. It returns the single output, or a tuple
    of the outputs in the program's flattened order.

    ``dim_names`` renames and ``dim_bounds`` narrows (``(lo, hi)``, None keeps a side) dynamic
    dims; both are keyed by a torch symbol (``s53``), by ``INPUT.AXIS`` (``input_ids.1``) or
    by a name given in ``dim_names``. An ATen op without a converter raises UnsupportedError
    naming the op and the node."""
    return translate(ep, keep_params_as_inputs, dim_names=dim_names, dim_bounds=dim_bounds).module


def translate(
    ep: Any,
    keep_params_as_inputs: bool = True,
    *,
    dim_names: Mapping[str, str] | None = None,
    dim_bounds: Mapping[str, Bounds] | None = None,
    copy_weights: bool = True,
) -> Any:
    """Like ``from_exported_program``, returning the ``Translation`` (module, weights, inputs,
    dims and the pytree specs a caller needs to run the module like the original model). The
    weights are copies, or with ``copy_weights=False`` (and the weights as params) read-only
    views of the program's tensors (see ``Translator``)."""
    from tilework.frontend.torch.translator import Translator, decompose_unsupported, functional, resolve_dim_refs

    ep = decompose_unsupported(functional(ep))
    names, bounds = resolve_dim_refs(ep, dim_names or {}, dim_bounds or {})
    return Translator(ep, keep_params_as_inputs, names, bounds, copy_weights=copy_weights, prepared=True).run()


__all__ = ["from_exported_program", "translate", "parse_dim_spec", "Bounds"]
