"""The process environment Arrow reads, set in one place (as tf_env for TensorFlow).

- Arrow's default memory pool is jemalloc unless ARROW_DEFAULT_MEMORY_POOL already names one. `recpipe
  preprocess` decodes a batch on one thread and frees it on others; Arrow's own default, mimalloc, then
  held 1,142 MB at the peak of a 5M-row job where jemalloc held 965 MB, at the same speed. Arrow reads it
  when pyarrow is first imported: recpipe/__init__.py imports this module first.
- Acero (behind `Table.group_by`) copies a column whose buffers are not aligned instead of warning about
  it, unless ACERO_ALIGNMENT_HANDLING already says otherwise: a table pickled from one Dask worker to
  another arrives with its buffers at any offset of the message.
"""
import os

os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
os.environ.setdefault("ACERO_ALIGNMENT_HANDLING", "reallocate")
