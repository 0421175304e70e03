"""What `recpipe cluster render` refuses before it writes a manifest: a name the API server or an operator
would reject, a day that is not a calendar date, project paths that are not on a volume every pod mounts,
and a manifest its vendored schema rejects (validate: recpipe/k8s_schemas, see SOURCES.md; offline).

Names follow RFC 1123 as Kubernetes applies them (k8s.io/apimachinery/pkg/util/validation): most objects
are DNS-1123 subdomains, Services DNS-1035 labels (a letter first), pod hostnames and subdomains DNS-1123
labels, and a label value has at most 63 characters. The operators derive names of their own from ours (a
TFJob's Service NAME-worker-0, a DaskJob's Service NAME-scheduler), so the render checks those too.
"""
from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from recpipe.common.days import day_name, day_number
from recpipe.common.errors import ConfigError, RecpipeError

__all__ = ["NameRule", "NameUse", "DNS1123_LABEL", "DNS1123_SUBDOMAIN", "DNS1035_LABEL", "LABEL_VALUE",
           "check_names", "check_day", "check_mount", "check_paths", "validate", "ManifestError"]

SCHEMAS = Path(__file__).resolve().parent / "k8s_schemas"
# core resources: their definition in kubernetes-definitions.json; custom resources: their own schema file
_DEFINITIONS = {("v1", "ConfigMap"): "io.k8s.api.core.v1.ConfigMap", ("v1", "Service"): "io.k8s.api.core.v1.Service",
                ("batch/v1", "Job"): "io.k8s.api.batch.v1.Job"}
_SCHEMA_FILES = {("kubeflow.org/v1", "TFJob"): "tfjob-v1.json",
                 ("kubeflow.org/v2beta1", "MPIJob"): "mpijob-v2beta1.json",
                 ("kubernetes.dask.org/v1", "DaskJob"): "daskjob-v1.json",
                 ("kubernetes.dask.org/v1", "DaskCluster"): "daskcluster-v1.json"}

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


class ManifestError(RecpipeError, ValueError):
    """A manifest its schema rejects; the message names the field."""


@dataclass(frozen=True)
class NameRule:
    title: str          # "a DNS-1035 label"
    pattern: re.Pattern
    max_len: int
    chars: str          # what such a name holds, for the message


@dataclass(frozen=True)
class NameUse:
    what: str           # where the name is used: "the Service the TFJob operator creates for worker 2"
    value: str
    rule: NameRule


DNS1123_LABEL = NameRule("a DNS-1123 label", re.compile(_LABEL), 63,
                         "lower-case letters, digits and '-', starting and ending with a letter or digit")
DNS1123_SUBDOMAIN = NameRule("a DNS-1123 subdomain", re.compile(rf"{_LABEL}(\.{_LABEL})*"), 253,
                             "lower-case letters, digits, '-' and '.', starting and ending with a letter or digit")
DNS1035_LABEL = NameRule("a DNS-1035 label", re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?"), 63,
                         "lower-case letters, digits and '-', starting with a letter and ending with a letter or "
                         "digit")
LABEL_VALUE = NameRule("a label value", re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"), 63,
                       "letters, digits, '-', '_' and '.', starting and ending with a letter or digit")


def check_names(option: str, given: str, uses: list[NameUse]) -> None:
    """Refuse the value of a command-line option when a name made from it breaks its rule.

    Args:
        option: the option, as the user typed it ("--name").
        given: its value; every use's value starts with it.
        uses: the names made from it, each with the rule Kubernetes applies to it.

    Raises:
        ConfigError: one line naming the option, the first name a rule rejects and why; for a name that is
            only too long, how many characters the option may have.
    """
    for use in uses:
        if not use.rule.pattern.fullmatch(use.value):
            where, whose = (f" for {use.what}", "it") if use.value == given else ("", f"{use.what} {use.value!r}")
            raise ConfigError(f"{option} {given!r} is not a valid Kubernetes name{where}: {whose} must be "
                              f"{use.rule.title} ({use.rule.chars})")
    for use in uses:
        if len(use.value) > use.rule.max_len:
            room = min(u.rule.max_len - (len(u.value) - len(given)) for u in uses)
            raise ConfigError(f"{option} {given!r} is too long: {use.what} {use.value!r} would have "
                              f"{len(use.value)} characters, over the {use.rule.max_len} of {use.rule.title}; "
                              f"{option} may have at most {room} characters here")


def check_day(day: str) -> str:
    """The day, when it is a calendar date written YYYY-MM-DD.

    Args:
        day: the --day option.

    Returns:
        `day`.

    Raises:
        ConfigError: not a date, or a date written otherwise (20260102).
    """
    try:
        why = "" if day_name(day_number(day)) == day else "write it YYYY-MM-DD"
    except ValueError as e:
        why = str(e)
    if why:
        raise ConfigError(f"--day {day!r} is not a calendar date YYYY-MM-DD: {why}")
    return day


def check_mount(mount: str, reserved: str) -> None:
    """Refuse a --volume-mount that is not an absolute folder apart from `reserved` (the project's mount).

    Args:
        mount: the --volume-mount option.
        reserved: where the project's ConfigMap is mounted.

    Raises:
        ConfigError: naming the option.
    """
    norm = posixpath.normpath(mount) if mount.startswith("/") else ""
    if not norm or norm != mount.rstrip("/") or norm == "/" or _under(norm, reserved) or _under(reserved, norm):
        raise ConfigError(f"--volume-mount {mount!r}: must be an absolute, normalised folder other than / and "
                          f"apart from {reserved} (where the project's ConfigMap is mounted)")


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def check_paths(project: str, paths: dict[str, str], claim: str | None, mount: str) -> None:
    """Refuse project paths the pods could not share: each must lie on the volume every pod mounts.

    Args:
        project: the project YAML, as the user named it.
        paths: its keys the pods read or write -> their path (resolved, as the steps will use it).
        claim: the --volume-claim mounted in every pod, or None.
        mount: where it is mounted (--volume-mount).

    Raises:
        ConfigError: no volume at all, or the first path off it, naming its key.
    """
    if claim is None:
        raise ConfigError(f"--volume-claim: none given, so every pod would read and write {', '.join(paths)} on a "
                          f"throwaway filesystem of its own; give the PersistentVolumeClaim that holds them (mounted "
                          f"at --volume-mount {mount})")
    for key, path in paths.items():
        if "://" in path or not _under(posixpath.normpath(path), mount):
            raise ConfigError(f"{project}: {key} {path} is not on a mounted volume (--volume-claim {claim} mounts "
                              f"at {mount})")


@lru_cache(maxsize=None)
def _validator(api_version: str, kind: str):
    import jsonschema
    from referencing import Registry, Resource
    definitions = json.loads((SCHEMAS / "kubernetes-definitions.json").read_text())
    registry = Registry().with_resource(definitions["$id"], Resource.from_contents(definitions))
    if (api_version, kind) in _DEFINITIONS:
        schema = {"$ref": f"{definitions['$id']}#/$defs/{_DEFINITIONS[api_version, kind]}"}
    elif (api_version, kind) in _SCHEMA_FILES:
        schema = json.loads((SCHEMAS / _SCHEMA_FILES[api_version, kind]).read_text())
    else:
        raise ManifestError(f"{api_version} {kind}: no vendored schema to validate it against")
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate(manifest: dict) -> None:
    """Check a manifest against its vendored schema.

    Args:
        manifest: one rendered manifest.

    Raises:
        ManifestError: naming the first field the schema rejects, or a kind with no vendored schema.
    """
    errors = sorted(_validator(manifest.get("apiVersion", ""), manifest.get("kind", "")).iter_errors(manifest),
                    key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        raise ManifestError(f"{manifest['kind']} {manifest.get('metadata', {}).get('name')}: {where}: {e.message}")
