"""The fleet: a study across GPU types, each on the nodes of a Ray cluster that carry it (``--ray``)."""
