"""The `recpipe` command line: a thin layer over features, pipeline, trainers and serving."""
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
