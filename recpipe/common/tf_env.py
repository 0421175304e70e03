"""The process environment TensorFlow reads when it is first imported, set in one place.

TensorFlow Recommenders needs tf-keras (Keras 2), never Keras 3: TF_USE_LEGACY_KERAS=1 must be in
the environment before `import tensorflow`. Every package of the project imports this module from
its __init__, so any entry point (the CLI, `python -m recpipe.trainers.strategies.ps`, a test, a notebook) has it set
before a module of ours can import TensorFlow.
"""
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
