"""Base names of kernels, for traces that do not record one.

nsys stores a ``shortName`` next to each demangled name; nvprof, ``nsys stats`` CSVs and
TF traces only have the full signature. Grouping ``by="short_name"`` must mean the same
thing for all of them, so this mirrors nsys's notion: the function's own identifier,
without return type, namespaces/classes, template arguments or parameter list.
"""

from __future__ import annotations

_OPEN = "<([{"
_CLOSE = ">)]}"


def short_kernel_name(name: str) -> str:
    """``void ns::foo<T, bar<U>>(int, float*)`` -> ``foo``; names without a signature pass through.

    Text inside brackets is skipped at any depth, so template arguments holding lambdas,
    parentheses or ``::`` do not leak into the result. The first ``(`` outside brackets
    opens the parameter list, except ``(anonymous namespace)``, which is a qualifier.
    Anything the scan cannot make sense of falls back to the full name rather than an
    empty string, because a name is only ever used as a grouping key.
    """
    text = name.replace("(anonymous namespace)::", "")
    kept: list[str] = []
    depth = 0
    for ch in text:
        if ch in _OPEN:
            if depth == 0 and ch == "(":
                break
            depth += 1
        elif ch in _CLOSE:
            depth = max(depth - 1, 0)
        elif depth == 0:
            kept.append(ch)
    words = "".join(kept).split()
    if not words:
        return name
    base = words[-1].rsplit("::", 1)[-1]
    return base or name
