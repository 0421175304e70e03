"""The order in which one day's manifests are applied: each step's objects once the step before has
finished, written as one folder per step and an `apply.sh` that applies them in turn and waits on each.

The steps are the components the manifests are labelled with (app.kubernetes.io/component): the project's
ConfigMap, preprocess, train, then evaluate -> bless -> push. A step has finished when each of its
workloads reports success in its status (a Job's Complete condition, a TFJob's or MPIJob's Succeeded, a
DaskJob's jobStatus Successful); the script stops at the first that reports failure. Every daily step is
idempotent, so running the script again resumes the day.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

__all__ = ["STEPS", "Step", "plan_steps", "order_lines", "apply_script", "write_steps"]

STEPS = ("config", "preprocess", "train", "publish")
_CONDITIONS = '{.status.conditions[?(@.status=="True")].type}'
# kind -> (kubectl resource, the status jsonpath it is read with, the word for success, the word for failure)
_STATUS = {"DaskJob": ("daskjob.kubernetes.dask.org", "{.status.jobStatus}", "Successful", "Failed"),
           "TFJob": ("tfjob.kubeflow.org", _CONDITIONS, "Succeeded", "Failed"),
           "MPIJob": ("mpijob.kubeflow.org", _CONDITIONS, "Succeeded", "Failed"),
           "Job": ("job.batch", _CONDITIONS, "Complete", "Failed")}


@dataclass(frozen=True)
class Step:
    """One step: its place in the order, its component, and its manifests."""
    index: int
    component: str
    manifests: list[dict]

    @property
    def folder(self) -> str:
        return f"{self.index}-{self.component}"

    def files(self) -> list[str]:
        """Returns each manifest's file, relative to the output folder."""
        return [f"{self.folder}/{m['metadata']['name']}-{m['kind'].lower()}.yaml" for m in self.manifests]

    def waits(self) -> list[tuple[str, str, str, str]]:
        """Returns (resource/name, status jsonpath, success word, failure word) of each workload the step
        waits for."""
        return [(f"{_STATUS[m['kind']][0]}/{m['metadata']['name']}", *_STATUS[m["kind"]][1:])
                for m in self.manifests if m["kind"] in _STATUS]


def plan_steps(manifests: list[dict]) -> list[Step]:
    """The manifests grouped into steps, in the order they are applied.

    Args:
        manifests: rendered manifests, each labelled app.kubernetes.io/component with one of STEPS.

    Returns:
        One Step per component present, in STEPS order.

    Raises:
        ValueError: a manifest without such a label.
    """
    by_step: dict[str, list[dict]] = {s: [] for s in STEPS}
    for m in manifests:
        component = m["metadata"].get("labels", {}).get("app.kubernetes.io/component")
        if component not in by_step:
            raise ValueError(f"{m['kind']} {m['metadata']['name']}: component {component!r} is not one of {STEPS}")
        by_step[component].append(m)
    present = [c for c in STEPS if by_step[c]]
    return [Step(i, c, by_step[c]) for i, c in enumerate(present)]


def order_lines(steps: list[Step], out_dir: str) -> list[str]:
    """The order for a reader.

    Args:
        steps: from plan_steps.
        out_dir: the folder the steps are written to.

    Returns:
        One line per step: the kubectl command applying its files, and what it waits for.
    """
    lines = []
    for n, step in enumerate(steps, 1):
        files = " ".join(f"-f {Path(out_dir) / f}" for f in step.files())
        waits = "; ".join(f"{r} reports {ok}" for r, _, ok, _ in step.waits())
        lines.append(f"{n}. {step.component}: kubectl apply {files}" + (f", then wait until {waits}" if waits else ""))
    return lines


def apply_script(steps: list[Step], namespace: Optional[str], title: str) -> str:
    """A POSIX shell script applying each step after the step before has finished.

    Args:
        steps: from plan_steps.
        namespace: the manifests' namespace (None: kubectl's current one).
        title: the script's first comment line (what the manifests run).

    Returns:
        The script's text.
    """
    ns = f" --namespace {shlex.quote(namespace)}" if namespace else ""
    out = ["#!/bin/sh", f"# {title}", "# Applies each step once the one before has finished; stops at the first "
           "failure. Every step is idempotent:", "# run it again to resume the day.",
           "#   KUBECTL (default: kubectl), POLL_SECONDS (default: 30): how often a status is read.",
           "set -eu", 'cd "$(dirname "$0")"', 'KUBECTL="${KUBECTL:-kubectl}"', 'POLL_SECONDS="${POLL_SECONDS:-30}"',
           "", "# finish RESOURCE JSONPATH SUCCESS FAILURE: wait until RESOURCE's status reads SUCCESS",
           "finish() {", "  while :; do",
           f'    state=" $($KUBECTL get "$1"{ns} -o "jsonpath=$2") "',
           '    case "$state" in',
           '      *" $3 "*) echo "$1: $3"; return 0 ;;',
           '      *" $4 "*) echo "$1: $4 (kubectl describe $1, and its pods\' logs, say why)" >&2; exit 1 ;;',
           "    esac", '    sleep "$POLL_SECONDS"', "  done", "}", ""]
    for n, step in enumerate(steps, 1):
        out.append(f"echo 'step {n} of {len(steps)}: {step.component}'")
        out.append("$KUBECTL apply " + " ".join(f"-f {shlex.quote(f)}" for f in step.files()))
        out += [f"finish {shlex.quote(r)} {shlex.quote(path)} {ok} {bad}" for r, path, ok, bad in step.waits()]
    return "\n".join(out) + "\n"


def write_steps(steps: list[Step], out_dir: str, namespace: Optional[str], title: str) -> tuple[list[str], list[str]]:
    """Write each step's manifests into its folder of `out_dir`, and `apply.sh` beside them.

    Args:
        steps: from plan_steps.
        out_dir: the output folder (created when missing).
        namespace: the manifests' namespace (None: kubectl's current one).
        title: what the manifests run, for the script's first comment.

    Returns:
        (the files written, manifests first, apply.sh last; the order as lines for a reader).
    """
    out = Path(out_dir)
    written = []
    for step in steps:
        (out / step.folder).mkdir(parents=True, exist_ok=True)
        for m, name in zip(step.manifests, step.files()):
            (out / name).write_text(yaml.safe_dump(m, sort_keys=False))
            written.append(str(out / name))
    script = out / "apply.sh"
    script.write_text(apply_script(steps, namespace, title))
    script.chmod(0o755)
    return [*written, str(script)], order_lines(steps, out_dir)
