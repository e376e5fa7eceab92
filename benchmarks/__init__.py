"""Benchmarks and experiments; each module is also a script (``python benchmarks/NAME.py --help``)."""
