"""Launching Horovod ranks and naming the first that fails: `recpipe train --strategy horovod --np N` re-runs
itself under `horovodrun -np N --gloo` on this host (recpipe.trainers.strategies.hvd_hosts starts a host's ranks of a job over
--hosts itself). Rank 0's progress reaches the launcher as JSON events (recpipe.trainers.progress); a rank's last
failure line, or what its exit status and Gloo's own words say, becomes the launcher's error."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from recpipe.trainers.errors import JobFault, TrainError, how_it_ended
from recpipe.trainers.model_dir import ModelDir, TrainState
from recpipe.trainers.options import TrainOptions, run_flags
from recpipe.trainers.progress import EVENTS_ENV, Reporter, follow_events

__all__ = ["inside_horovod_job", "horovodrun", "rank_command", "supervise", "RankDeath", "rank_death", "rank_died",
           "launch", "written_state"]


def inside_horovod_job() -> bool:
    return "HOROVOD_RANK" in os.environ


def horovodrun() -> str:
    """The horovodrun of this environment, when Horovod is built with its TensorFlow ops; else a TrainError.
    Checked by the ops' library file, not by importing horovod.tensorflow: that imports TensorFlow, which
    the launcher does not need. A library built for another TensorFlow fails each rank's import, and the
    launcher names that rank's error and says to rebuild it (rank_death)."""
    found = shutil.which("horovodrun", path=os.path.dirname(sys.executable)) or shutil.which("horovodrun")
    if not _has_tensorflow_ops():
        found = None
    if not found:
        raise TrainError("--strategy horovod needs Horovod built for this TensorFlow: run `make horovod` "
                         "(builds 0.28.1 from source, about 10 minutes once, then cached)")
    return found


def _has_tensorflow_ops() -> bool:
    """Whether the installed Horovod holds its compiled TensorFlow ops (horovod/tensorflow/mpi_lib*.so); a
    Horovod built without TensorFlow has none. Finding the package runs none of its code."""
    spec = importlib.util.find_spec("horovod")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        ops = os.path.join(folder, "tensorflow")
        if os.path.isdir(ops) and any(f.startswith("mpi_lib") and f.endswith(".so") for f in os.listdir(ops)):
            return True
    return False


def rank_command(opts: TrainOptions) -> list[str]:
    """What every rank runs: this `recpipe train` with the config this launcher resolved."""
    cmd = [sys.executable, "-m", "recpipe.cli", "train", "--data", opts.data_dir, "--model-dir", opts.model_dir,
           "--config", ModelDir(opts.model_dir).config_path, *run_flags(opts.run), "--strategy", "horovod"]
    return (cmd + (["--warm-start", opts.warm_start] if opts.warm_start else [])
            + (["--synthetic-input"] if opts.synthetic_input else []))


def supervise(start: Callable[[dict], list[subprocess.Popen]], say: Callable[[str], None]) -> list[tuple]:
    """Start rank processes (start(extra_env) -> processes), show rank 0's progress events, wait for all;
    when one fails, stop the others. Returns (returncode, last output lines, order of failure) per
    process (order 0: the first to fail; None: it did not fail first-hand)."""
    with tempfile.TemporaryDirectory(prefix="recpipe-hvd-") as tmp:
        events = os.path.join(tmp, "events.jsonl")
        reporter = Reporter(say, 0, 0, 0)
        done = threading.Event()
        follower = threading.Thread(target=follow_events, args=(events, _replay(reporter), done), daemon=True)
        follower.start()
        procs = start({"TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3"), EVENTS_ENV: events})
        tails: list[list[str]] = [[] for _ in procs]

        def drain(i: int, proc: subprocess.Popen) -> None:
            for line in proc.stdout:  # kept for error messages only (the last lines, the first line naming a
                raw = line.rstrip("\n")  # dead rank, each rank's last failure line, with its "[rank]<stderr>:"
                old = tails[i]            # prefix); progress comes as events
                tails[i] = ([t for t in old if _DIED.search(t)][:1] + _last_failures(old)
                            + [t for t in old if not _DIED.search(t) and not _failure(t)][-19:]
                            + [raw if _failure(raw) else raw.split(">:", 1)[-1]])

        readers = [threading.Thread(target=drain, args=(i, p), daemon=True) for i, p in enumerate(procs)]
        for r in readers:
            r.start()
        failed: list[int] = []
        while any(p.poll() is None for p in procs):
            for i, p in enumerate(procs):
                if p.poll() not in (None, 0) and i not in failed:
                    failed.append(i)
            if failed:
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
            done.wait(0.2)
        failed += [i for i, p in enumerate(procs) if p.returncode not in (0, None) and i not in failed]
        for r in readers:
            r.join(timeout=5)
        done.set()
        follower.join()
        reporter.close()
    return [(p.returncode, t, failed.index(i) if i in failed else None) for i, (p, t) in enumerate(zip(procs, tails))]


_DIED = re.compile(r"Process (\d+) exit with status code (-?\d+)")


# what a rank prints when it fails: the CLI's "recpipe train: error: ...", or a traceback's last line;
# under horovodrun each line starts with "[rank]<stdout>:" or "[rank]<stderr>:"
_RANK_PREFIX = re.compile(r"^\[(\d+)\]<std(?:out|err)>:")
_CLI_ERROR = re.compile(r"^\s*recpipe [\w-]+: error: (.+)")
_RAISED = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?([A-Za-z_]\w*(?:Error|Exception): .+)")  # module path dropped


# Gloo's rendezvous giving up on ranks that never registered (then std::terminate: SIGABRT, no traceback)
_NEVER_JOINED = re.compile(r"Wait timeout after (\d+) seconds for key\(s\): ([\d ,]+)")
NEVER_JOINED = "which never joined"  # in _failure's message for such a line
# Gloo's HTTP store giving up on the rendezvous server (horovodrun's, or the first host's over --hosts)
_STORE_GONE = re.compile(r"HTTP (?:\w+ )?request failed too many times")
STORE_GONE = "Gloo's rendezvous store did not answer (HTTP requests to it failed)"
# a rank's import of Horovod's TensorFlow ops, built for another TensorFlow, failing
_OPS_MISMATCH = re.compile(r"horovod/tensorflow/mpi_lib[^:\s]*\.so: undefined symbol")


def _failure(line: str) -> tuple[Optional[int], str] | None:
    """(rank or None when the line has no horovodrun prefix, message) of a failure line a rank printed;
    None for any other line, horovodrun's own 'one or more processes exited' included."""
    prefix = _RANK_PREFIX.match(line)
    rank, rest = (int(prefix[1]), line[prefix.end():]) if prefix else (None, line)
    joined = _NEVER_JOINED.search(rest)
    if joined:
        ranks = ", ".join(re.findall(r"\d+", joined[2]))
        return rank, (f"Gloo's rendezvous waited {joined[1]} s for rank(s) {ranks}, {NEVER_JOINED} "
                      f"(HOROVOD_GLOO_TIMEOUT_SECONDS)")
    if _STORE_GONE.search(rest):
        return rank, STORE_GONE
    m = _CLI_ERROR.match(rest) or _RAISED.match(rest)
    if m is None or "one or more processes exited" in line:
        return None
    return rank, m[1].strip()


def _last_failures(lines: list[str]) -> list[str]:
    """Each rank's last failure line."""
    last = {}
    for line in lines:
        found = _failure(line)
        if found:
            last[found[0]] = line
    return list(last.values())


@dataclass(frozen=True)
class RankDeath:
    cause: str        # "horovod rank R<where> died (how: its last failure line; hint)"
    first_hand: bool  # False: a symptom of another rank's end (a collective failing, Gloo giving up)


# a rank's error that only says another rank is gone: its collectives or Gloo's connections failed
_SYMPTOM = re.compile(r"Gloo|Horovod\w*(?:Allreduce|Allgather|Broadcast|Alltoall|Reducescatter|Barrier|Join)|"
                      r"Horovod has been shut down|[Cc]onnection (?:closed|reset)|Broken pipe")


def rank_death(rank: int, code: int, where: str = "", output: list[str] = (),
               host_of: Optional[dict[int, tuple[int, str]]] = None) -> RankDeath:
    """output: the last lines of the rank's own process, or of horovodrun's (then each prefixed by its
    rank): the rank's last failure line there, if any, is given as the cause. Another rank's error
    (e.g. a collective failing because this rank was killed) is not. host_of: rank -> (host index, host)
    of a job over --hosts, to say where ranks that never joined should have started."""
    causes = [f[1] for f in map(_failure, output) if f is not None and f[0] in (None, rank)]
    hint = ""
    joined = next((m for m in map(_NEVER_JOINED.search, output) if m), None)
    if joined and causes and NEVER_JOINED in causes[-1] and host_of:
        missing = sorted({host_of[int(r)] for r in re.findall(r"\d+", joined[2]) if int(r) in host_of})
        hint = "".join(f"; is `recpipe train ... --host-index {i}` running on {h}, or did it stop before starting its "
                       f"ranks (its own output says why)?" for i, h in missing[:3])
    elif causes and causes[-1] == STORE_GONE and host_of:
        hint = (f"; it is served by `recpipe train ... --host-index 0` on {host_of[0][1]}: is that still running, "
                f"or did it stop (its own output says why)?")
    elif causes and _OPS_MISMATCH.search(causes[-1]):  # horovodrun() checks the ops' file, not that they load
        hint = "; Horovod's TensorFlow ops were built for another TensorFlow: rebuild them with `make horovod`"
    # (_failure's own words for Gloo giving up, NEVER_JOINED's and STORE_GONE's, name Gloo too)
    symptom = bool(_SYMPTOM.search(causes[-1])) if causes else code in (-signal.SIGABRT, -signal.SIGTERM)
    return RankDeath(f"horovod rank {rank}{where} died ({how_it_ended(code)}{': ' + causes[-1] if causes else ''}"
                     f"{hint})", not symptom)


def rank_died(opts: TrainOptions, rank: int, code: int, where: str = "", output: list[str] = (),
              host_of: Optional[dict[int, tuple[int, str]]] = None) -> JobFault:
    """The launcher's error for a rank that died (rank_death's cause, and what a rerun does)."""
    cause = rank_death(rank, code, where, output, host_of).cause
    return JobFault(str(ModelDir(opts.model_dir).stopped(cause)), cause)


def launch(opts: TrainOptions, say: Callable[[str], None]) -> TrainState:
    """Run `recpipe train --strategy horovod` as opts.run.np ranks on this host; raise if any rank fails.
    Rank 0's progress reaches this process as JSON events (recpipe.trainers.progress), shown as its lines."""
    run = opts.run
    cmd = [horovodrun(), "-np", str(run.np), "-H", f"localhost:{run.np}", "--gloo", *rank_command(opts)]
    say(f"train: horovodrun -np {run.np} --gloo on localhost")
    (rc, tail, _), = supervise(lambda env: [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                              text=True, env=dict(os.environ, **env))], say)
    if rc != 0:
        died = next((m for m in map(_DIED.search, tail) if m), None)  # horovodrun names the first rank to fail
        if died:
            raise rank_died(opts, int(died[1]), int(died[2]), output=tail)
        raise TrainError(f"horovodrun exited with {rc}: " + " | ".join(t for t in tail if t)[-800:])
    return written_state(opts)


def written_state(opts: TrainOptions) -> TrainState:
    state = ModelDir(opts.model_dir).state()
    if state is None:
        raise TrainError(f"{opts.model_dir}: the ranks finished but rank 0 wrote no train_state.json")
    return state


def _replay(reporter: Reporter) -> Callable[[dict], None]:
    def show(event: dict) -> None:
        if event.get("kind") == "step" and reporter.bar.total != event["total"]:
            reporter.bar.total = reporter.total = event["total"]  # the bar learns the length from rank 0
        reporter.replay(event)
    return show
