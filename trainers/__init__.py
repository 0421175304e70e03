"""TFRS models and the training loop (local strategy), reading what pipeline/ writes."""
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
