"""`recpipe bench`: every benchmark of the product (recpipe.bench.run), each ratio against its
baseline measured in the same run.

Kept free of imports: `python -m recpipe.bench.measure` runs through this package, and that
launcher must stay small (see measure.py).
"""
