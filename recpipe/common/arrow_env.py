"""The process environment Arrow reads when it is first imported, set in one place (as tf_env for TensorFlow).

Arrow's default memory pool is jemalloc unless ARROW_DEFAULT_MEMORY_POOL already names one. `recpipe
preprocess` decodes a batch on one thread and frees it on others; Arrow's own default, mimalloc, then
held 1,142 MB at the peak of a 5M-row job where jemalloc held 965 MB, at the same speed. The variable
must be in the environment before pyarrow is imported: recpipe/__init__.py imports this module first.
"""
import os

os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
