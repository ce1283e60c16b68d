"""Experiment configs and the ``python -m experiments`` command line."""
