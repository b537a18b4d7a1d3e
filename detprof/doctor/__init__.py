"""`detprof doctor`: whether this machine is ready to measure, one check per thing a sweep relies on."""
