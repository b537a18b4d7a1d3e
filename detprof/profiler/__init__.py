"""Running measured studies: the plan, the launcher and its worker processes, lockstep pairs, tracers, devices."""
