"""TFRS models, the training loops (local, PS, Horovod), evaluation, reading what pipeline/ writes."""
from features import tf_env  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
