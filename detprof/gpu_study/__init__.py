"""``detprof gpu-study``: the whole answer from one GPU lease, in the order of its value, within a time budget.

A GPU comes rarely and for minutes, so the study is a plan of parts (``plan``): the overhead of
the models whose answer matters most first, then the rest of the zoo, the knob study of the
model that pays most, what determinism buys, and ``verify``. A window (``window``) runs the parts
that fit its budget, stops a part at the budget's end keeping what it measured, and leaves the rest
for ``--resume`` in the next window; every window ends with a bundle (``detprof.bundle``) that
``detprof report`` reads on any machine.
"""
