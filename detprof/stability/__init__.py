"""Training-stability core: noise-source variants, repeated runs, and what the noise does."""
