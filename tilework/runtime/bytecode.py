"""VM bytecode and its generation from lowered graph functions.

A ``VMFunction`` is register code with four instructions:

- ``("call", dst, (kind, name), args)``: ``regs[dst] = callee(*args)``; ``kind`` is ``builtin``
  (``tilework.runtime.builtins``), ``kernel`` (a compiled TensorFunc), ``func`` (another VM
  function) or ``extern`` (a registered library function); each arg is ``("r", reg)``,
  ``("i", immediate)`` or ``("c", constant index)``;
- ``("ret", reg)``; ``("goto", pc)``; ``("if", reg, else_pc)`` (falls through when true).

The bytecode is plain data (tuples, ints, floats, strings, None): ``to_data``/``from_data``
give the JSON form an executable file stores, and ``from_data`` checks every field, so a
malformed or hostile file cannot make the VM run anything but these four instructions over
builtins, kernels, library functions and VM functions it resolves by name. ``tilework.codegen
.vm_codegen`` generates bytecode from a lowered module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tilework.errors import TileworkError

Instr = tuple[Any, ...]


@dataclass(frozen=True)
class VMFunction:
    name: str
    params: tuple[str, ...]
    num_regs: int
    code: tuple[Instr, ...]


# -- the data form ------------------------------------------------------------------------------
# JSON holds ints, strings, bools and None as they are; a tuple is {"t": [...]}, a float
# {"f": float.hex(x)} (exact, and NaN and infinities too). Nothing else is an immediate.

KINDS = ("builtin", "kernel", "func", "extern")
ARG_TAGS = ("r", "i", "c")


def encode_value(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return {"f": v.hex()}
    if isinstance(v, tuple):
        return {"t": [encode_value(x) for x in v]}
    raise TileworkError(f"bytecode immediate {v!r} of type {type(v).__name__} cannot be stored (ints, floats, strings, bools, None and tuples of them can)")


def decode_value(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, dict) and len(v) == 1:
        if "f" in v and isinstance(v["f"], str):
            try:
                return float.fromhex(v["f"])
            except ValueError:
                pass
        elif "t" in v and isinstance(v["t"], list):
            return tuple(decode_value(x) for x in v["t"])
    raise TileworkError(f"malformed bytecode immediate {v!r}")


def to_data(fn: VMFunction) -> dict[str, Any]:
    """The JSON-able form of ``fn``."""
    code: list[list[Any]] = []
    for ins in fn.code:
        if ins[0] == "call":
            _, dst, (kind, name), args = ins
            code.append(["call", dst, kind, name, [[tag, encode_value(v)] for tag, v in args]])
        else:
            code.append(list(ins))
    return {"name": fn.name, "params": list(fn.params), "num_regs": fn.num_regs, "code": code}


def _int(v: Any, lo: int, hi: int, what: str) -> int:
    if type(v) is not int or not lo <= v < hi:
        raise TileworkError(f"malformed bytecode: {what} {v!r} is not an int in [{lo}, {hi})")
    return v


def from_data(d: Any, num_constants: int) -> VMFunction:
    """A VMFunction from its data form, every field checked: register numbers within the
    function's registers, constant indices within the pool, jumps forward only and within the
    code (generated code has no loops, so a file cannot make the VM spin), the last instruction
    a ``ret``, callee kinds from ``KINDS``, names as strings."""
    if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not isinstance(d.get("code"), list):
        raise TileworkError("malformed bytecode: a function needs a name and code")
    name = d["name"]
    params = d.get("params")
    if not isinstance(params, list) or not all(isinstance(p, str) for p in params):
        raise TileworkError(f"malformed bytecode of {name}: params must be names")
    num_regs = _int(d.get("num_regs"), len(params), 1 << 24, f"{name}: register count")
    n = len(d["code"])
    code: list[Instr] = []
    for pc, ins in enumerate(d["code"]):
        if not isinstance(ins, list) or not ins or ins[0] not in ("call", "ret", "goto", "if"):
            raise TileworkError(f"malformed bytecode of {name}: unknown instruction {ins!r}")
        op = ins[0]
        if op == "call" and len(ins) == 5:
            _, dst, kind, callee, args = ins
            if kind not in KINDS or not isinstance(callee, str) or not isinstance(args, list):
                raise TileworkError(f"malformed bytecode of {name}: bad call {ins!r}")
            decoded = []
            for a in args:
                if not isinstance(a, list) or len(a) != 2 or a[0] not in ARG_TAGS:
                    raise TileworkError(f"malformed bytecode of {name}: bad argument {a!r}")
                tag, v = a
                if tag == "r":
                    v = _int(v, 0, num_regs, f"{name}: register")
                elif tag == "c":
                    v = _int(v, 0, num_constants, f"{name}: constant index")
                else:
                    v = decode_value(v)
                decoded.append((tag, v))
            code.append(("call", _int(dst, 0, num_regs, f"{name}: register"), (kind, callee), tuple(decoded)))
        elif op == "ret" and len(ins) == 2:
            code.append(("ret", _int(ins[1], 0, num_regs, f"{name}: register")))
        elif op == "goto" and len(ins) == 2:
            code.append(("goto", _int(ins[1], pc + 1, n, f"{name}: jump target")))
        elif op == "if" and len(ins) == 3:
            code.append(("if", _int(ins[1], 0, num_regs, f"{name}: register"), _int(ins[2], pc + 1, n, f"{name}: jump target")))
        else:
            raise TileworkError(f"malformed bytecode of {name}: bad instruction {ins!r}")
    if not code or code[-1][0] != "ret":
        raise TileworkError(f"malformed bytecode of {name}: the code does not end in ret")
    return VMFunction(name, tuple(params), num_regs, tuple(code))

