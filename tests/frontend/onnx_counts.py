"""The counts of docs/conformance.md, from the converter table and the expected-failure list.

    python -m tests.frontend.onnx_counts

A full run (``TILEWORK_ONNX_FULL=1 python -m pytest tests/frontend/test_onnx_conformance.py``)
checks that exactly the listed tests fail among the attempted ones, so the passed count is the
attempted count less the list. Prints the results table, the failures by reason and the ops of
the tests not attempted.
"""

from __future__ import annotations

import collections
import warnings

import onnx

from tilework.frontend.onnx import supported, supported_ops
from tilework.frontend.onnx.importer import default_opset

from tests.frontend.test_onnx_conformance import ATTEMPTED, EXPECTED_FAILURES, NODE_CASES, _ops


def _missing_ops(model: onnx.ModelProto) -> list[str]:
    try:
        opset = default_opset(model)
    except Exception:  # noqa: BLE001 - a model without the default domain
        return ["(no default-domain opset)"]
    return sorted({n.op_type for n in _ops(model.graph) if not supported(n.op_type, opset, n.domain)})


def op_table() -> str:
    """The "Opsets claimed" list: each op with its converted schema versions."""
    ops = supported_ops()
    parts = []
    for name in sorted(ops, key=str.lower):
        spans = "/".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in ops[name])
        parts.append(f"{name} {spans}")
    return f"{len(ops)} ops: " + ", ".join(parts) + "."


def main() -> None:
    print(op_table() + "\n")
    total, attempted = len(NODE_CASES), len(ATTEMPTED)
    failed = len(EXPECTED_FAILURES)
    passed = attempted - failed
    print("| | count |\n|---|---|")
    print(f"| node tests (total) | **{total}** |")
    print(f"| attempted: every op of the test has a converter for its schema version | **{attempted}** |")
    print(f"| passed | **{passed}** ({100 * passed / attempted:.1f} % of attempted, {100 * passed / total:.1f} % of all) |")
    print(f"| failed: listed in `tests/frontend/onnx_expected_failures.txt` | {failed} |")
    reasons = collections.Counter(r.split(":")[0] if r.startswith("dtype:") else r for r in EXPECTED_FAILURES.values())
    print("\nfailures by reason:")
    for r, n in reasons.most_common():
        print(f"  {n:4d}  {r}")
    by_ops: collections.Counter[str] = collections.Counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, case in NODE_CASES.items():
            if name not in ATTEMPTED and case.model is not None:
                by_ops[", ".join(_missing_ops(case.model))] += 1
    print(f"\nnot attempted ({total - attempted}), by the ops without a converter:")
    for ops, n in by_ops.most_common():
        print(f"  {n:4d}  {ops}")


if __name__ == "__main__":
    main()
