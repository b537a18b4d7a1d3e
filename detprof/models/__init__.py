"""The model registry: Keras applications and the CNNs of the papers detprof reproduces."""
