"""jaxnorm: normalization for deep networks in JAX."""
