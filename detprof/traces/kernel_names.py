"""Base names of kernels, for traces that do not record one.

nsys stores a ``shortName`` next to each demangled name; nvprof, ``nsys stats`` CSVs and
TF traces only have the full signature. Grouping ``by="short_name"`` must mean the same
thing for all of them, so this mirrors nsys's notion: the function's own identifier,
without return type, namespaces/classes, template arguments or parameter list.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

_OPEN = "<([{"
_CLOSE = ">)]}"
_ANONYMOUS = "(anonymous namespace)::"
_QUALIFIERS = re.compile(r"\b(?:[A-Za-z_]\w*::)+")
DISPLAY_CHARS = 60
"""The longest name a table shows unless asked for full names: one line beside the numbers."""
ELLIPSIS = "\u2026"


def short_kernel_name(name: str) -> str:
    """``void ns::foo<T, bar<U>>(int, float*)`` -> ``foo``; names without a signature pass through.

    Text inside brackets is skipped at any depth, so template arguments holding lambdas,
    parentheses or ``::`` do not leak into the result. The first ``(`` outside brackets
    opens the parameter list, except ``(anonymous namespace)``, which is a qualifier.
    Anything the scan cannot make sense of falls back to the full name rather than an
    empty string, because a name is only ever used as a grouping key.
    """
    text = name.replace(_ANONYMOUS, "")
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


def _kernel_template_args(name: str, short: str) -> str | None:
    """The template arguments of the kernel function itself: ``void ns::f<a, g<b>>(int)`` -> ``a, g<b>``.

    Only a bracket group that directly follows the kernel's own name counts: in
    ``ns::Outer<T>::run(int)`` the ``<T>`` belongs to the class, not to ``run``.
    """
    text = name.replace(_ANONYMOUS, "")
    depth = 0
    group: tuple[int, int] | None = None
    start = 0
    end = len(text)
    for i, ch in enumerate(text):
        if ch in _OPEN:
            if depth == 0 and ch == "(":
                end = i
                break
            if depth == 0 and ch == "<":
                start = i
            depth += 1
        elif ch in _CLOSE:
            depth = max(depth - 1, 0)
            if depth == 0 and ch == ">":
                group = (start, i)
    head = text[:end].rstrip()
    if group is None or group[1] != len(head) - 1 or not head[: group[0]].endswith(short):
        return None
    return head[group[0] + 1 : group[1]]


def _collapse_parameter_lists(text: str) -> str:
    """``f(int, double&)::[lambda(int) (instance 2)]`` -> ``f(…)::[lambda(…) (instance 2)]``.

    A ``(`` right after a name or a template opens a parameter list, which is long and
    rarely tells two instances apart; one after a space (``(instance 2)``) is kept.
    """
    out: list[str] = []
    depth = 0
    for i, ch in enumerate(text):
        if depth:
            if ch in _OPEN:
                depth += 1
            elif ch in _CLOSE:
                depth -= 1
                if depth == 0:
                    out.append(f"({ELLIPSIS})")
            continue
        if ch == "(" and i and (text[i - 1].isalnum() or text[i - 1] in "_>"):
            depth = 1
            continue
        out.append(ch)
    return "".join(out)


def _abbreviated(name: str, short: str, max_chars: int) -> str:
    """The short name with its template arguments, qualifiers and parameter lists dropped, on one line."""
    args = _kernel_template_args(name, short)
    if not args:
        return _cut_middle(short, max_chars)
    args = " ".join(_QUALIFIERS.sub("", _collapse_parameter_lists(args)).split())
    return _cut_middle(f"{short}<{args}>", max_chars)


def _cut_middle(text: str, max_chars: int) -> str:
    """Keep both ends: the first template argument and the last (often ``(instance 3)``) tell kernels apart."""
    if len(text) <= max_chars:
        return text
    keep = max(max_chars - 1, 2)
    head = (keep * 3 + 4) // 5
    return text[:head] + ELLIPSIS + text[len(text) - (keep - head) :]


def display_kernel_names(names: Sequence[str], max_chars: int = DISPLAY_CHARS) -> list[str]:
    """One short, one-line label per kernel of a table, different for different kernels.

    A demangled name can run to hundreds of characters (template arguments, lambdas,
    parameter lists), which wraps a table row over dozens of lines. The short name alone
    is what nsys shows, but many kernels of one table often share it (every Eigen kernel
    is ``EigenMetaKernel``), so those get their template arguments, abbreviated; any that
    still read the same are numbered ``#1``, ``#2`` in table order (within ``max_chars``, the number
    included). A short name that is long
    by itself (ROCm's Tensile kernels, ``Cijk_Alik_Bljk_..._WG64_4_1``, run to 400 characters
    without a template) is cut in the middle like the rest. Full names stay in the data; this
    is only how a table labels its rows.
    """
    shorts = [short_kernel_name(n) for n in names]
    shared = Counter(shorts)
    labels = [
        _cut_middle(s, max_chars) if shared[s] == 1 else _abbreviated(n, s, max_chars)
        for n, s in zip(names, shorts, strict=True)
    ]
    repeated = Counter(labels)
    seen: Counter[str] = Counter()
    out: list[str] = []
    for label in labels:
        if repeated[label] == 1:
            out.append(label)
            continue
        seen[label] += 1
        number = f" #{seen[label]}"
        out.append(_cut_middle(label, max_chars - len(number)) + number)
    return out
