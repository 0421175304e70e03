"""TFRS models, the training loops (local, PS, Horovod), evaluation, reading what pipeline/ writes."""
