"""The `recpipe` process's own runtime, apart from what its commands do: a quiet start-up (TensorFlow's
C++ start-up lines and library warnings hidden unless `-v` or RECPIPE_DEBUG=1), errors as one line, and
how a PS chief ends (its own temp folder, os._exit)."""
from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
import warnings

from recpipe.common.errors import RecpipeError

__all__ = ["say", "quiet_startup", "tensorflow_at_startup", "tensorflow_after_reexec", "one_line", "ps_chief",
           "own_tempdir", "exit_now"]

# commands that never import TensorFlow, and the `daily` steps that do not: the sensor's probe, and the
# Beam job (a DAG's preprocess task paid TensorFlow's start-up, 3.3 s of CPU and 530 MB, for nothing)
NO_TENSORFLOW = ("init", "config", "preprocess", "generate", "criteo-to-parquet", "instacart-to-parquet", "movielens-to-parquet",
                 "cluster")
NO_TENSORFLOW_DAILY = ("ready", "preprocess")


def reexecs(args) -> bool:
    """Whether the command may re-execute itself under its allocator (recpipe.trainers.allocator.reexec_with)
    first: it imports TensorFlow after that, since importing it before would pay for it twice (2.3 s of CPU
    and 2.4 s of wall more in each quick `recpipe train`), unless it only launches Horovod ranks
    (recpipe.trainers.strategies.hvd_job), which do."""
    return args.command == "train" or (args.command == "daily" and args.step == "train")


def tensorflow_at_startup(args) -> bool:
    """Whether main() imports TensorFlow (quietly) before the command runs: not for a command or `daily`
    step that never uses it, nor for one that imports it once re-executed (tensorflow_after_reexec)."""
    if args.command in NO_TENSORFLOW or reexecs(args):
        return False
    return not (args.command == "daily" and args.step in NO_TENSORFLOW_DAILY)


def tensorflow_after_reexec(a) -> None:
    """What quiet_startup does for every other TensorFlow command, once the process runs under its
    allocator."""
    if not (a.verbose or os.environ.get("RECPIPE_DEBUG")):
        import_tensorflow_quietly()


def say(msg: str) -> None:
    print(msg, flush=True)


class _DropRootWarnings(logging.Filter):
    """Libraries that log warnings straight on the root logger (Beam: "apitools not found, and
    bigquery client libraries are not available ..."): errors pass, the rest is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def import_tensorflow_quietly() -> None:
    """TensorFlow's C++ libraries print start-up lines while they load, which TF_CPP_MIN_LOG_LEVEL
    does not silence (tensorflow#100442); nothing prints after the import. So import it once here
    with the process's stderr (fd 2) pointed at a temp file, whose text is replayed if the import fails."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            import tensorflow  # noqa: F401  (here: the first import is the noisy one)
        except BaseException:
            os.dup2(saved, 2)
            sink.seek(0)
            sys.stderr.write(sink.read().decode("utf-8", "replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def quiet_startup(verbose: bool, uses_tensorflow: bool) -> None:
    """Before TensorFlow or Beam is imported: hide their start-up noise unless verbose."""
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")   # C++ logs after start-up, here and in our children
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")    # inherited by the processes we start
    warnings.filterwarnings("ignore")
    logging.getLogger().addFilter(_DropRootWarnings())
    for name in ("tensorflow", "absl", "h5py", "matplotlib"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # Beam logs a failing transform's traceback at ERROR before re-raising; the error is printed once, as
    # one line, by main() (-v / RECPIPE_DEBUG=1 show the traceback).
    logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
    if uses_tensorflow:
        import_tensorflow_quietly()


def one_line(e: BaseException) -> str:
    """Our errors are one line already. Beam re-raises a worker's error with the worker's traceback
    inside: the cause is the last line that says something (not a bracket or a `[while running ...]`)."""
    if isinstance(e, RecpipeError):
        return " ".join(str(e).split())[:1000] or type(e).__name__
    # Keras ends a layer's error with the arguments of the call ("• x=tf.Tensor(...)"): the cause is above them
    text, layer = str(e).split("\nCall arguments received by layer")[0], ""
    named = re.match(r"\s*Exception encountered when calling layer '([^']+)' \(type (\w+)\)", text)
    if named:
        text, layer = text[named.end():], f"layer '{named.group(1)}' ({named.group(2)}): "
    lines = [ln.strip() for ln in text.strip().splitlines() if len(ln.strip().strip("()[]{}'\",. ")) > 2]
    lines = [ln for ln in lines if not ln.startswith("[while running")] or lines
    return (layer + lines[-1])[:1000] if lines else type(e).__name__


def ps_chief(args) -> bool:
    return args.command == "train" and getattr(args, "strategy", None) == "ps"


_CHIEF_TEMP_PREFIX = "recpipe-ps-chief-"


def own_tempdir() -> None:
    """Point this process's temporary files at a folder of its own, which exit_now removes: os._exit
    runs no atexit handler, and TensorFlow's AutoGraph deletes the source files it writes to the temp
    folder (13 per PS run) only in one, so otherwise every PS run would leave them in /tmp. Not in a worker or
    PS task that TF_CONFIG starts: it serves until it is killed, so its folder would stay behind."""
    from recpipe.trainers.strategies.tf_config import tf_config
    cluster = tf_config()
    if cluster is None or cluster.task_type == "chief":
        tempfile.tempdir = tempfile.mkdtemp(prefix=_CHIEF_TEMP_PREFIX)


def exit_now(code: int, last_line: str | None = None) -> None:
    """End a PS chief here. Its remote eager context logs hundreds of gRPC errors per task as the
    interpreter tears it down, after a successful run too, burying the run's last line; the tasks this
    process started are stopped and its checkpoints and train_state.json written by then.
    `last_line` goes to stderr last: ClusterCoordinator's threads and TensorFlow's runtime go on logging
    their workers' failures until os._exit (after the error line too, when a PS task was killed), so
    from here everything else written to stderr goes to /dev/null."""
    sys.stdout.flush()
    sys.stderr.flush()
    if last_line is not None:
        err = os.dup(2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        os.write(err, (last_line + "\n").encode())
    if tempfile.tempdir and os.path.basename(tempfile.tempdir).startswith(_CHIEF_TEMP_PREFIX):
        shutil.rmtree(tempfile.tempdir, ignore_errors=True)
    os._exit(code)
