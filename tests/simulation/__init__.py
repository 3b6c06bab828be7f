"""Deterministic simulation of replicated streams (``make sim``): see :mod:`simulation.world`,
:mod:`simulation.checker` and :mod:`simulation.run`."""
