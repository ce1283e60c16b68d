"""One ``get_config()`` file per experiment; the module docstring's first line describes it."""
