"""Beam options of `recpipe preprocess`: the defaults, recpipe's short forms, a check that every
option is one Beam knows (Beam itself only logs "Discarding unparseable args" and runs on), and the
runner they select.

Short forms: `--runner dask` = `--runner=recpipe.pipeline.dask_runner.DaskRunner`; `--dask-address ADDR` =
`--dask_client_address=ADDR`.
"""
from __future__ import annotations

import difflib
from typing import Optional

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.runner import PipelineRunner

from recpipe.common.errors import RecpipeError

__all__ = ["DEFAULT_BEAM_ARGS", "DASK_RUNNER", "BeamOptionsError", "beam_args_with_defaults", "unknown_options",
           "check_beam_args", "pipeline_runner"]

# DirectRunner in one process on any number of cores; any --runner/--direct_* option given by the user wins.
# Using more cores does not pay: on 2 cores, 2 workers of multi_processing, multi_threading or a local Dask
# cluster all produce the same artifact with exact row accounting, but each is slower than in_memory at
# 20k, 2M and 6M rows (in_memory already keeps Arrow's threads busy; worker processes add their start-up
# and the encoding of every element between stages). `recpipe bench preprocess` measures all of them
# against DuckDB in every run (bench/results/preprocess.md, "Against DuckDB").
DEFAULT_BEAM_ARGS = ("--runner=DirectRunner", "--direct_running_mode=in_memory")
DASK_RUNNER = "recpipe.pipeline.dask_runner.DaskRunner"
_RUNNER_ALIASES = {"dask": DASK_RUNNER, "direct": "DirectRunner"}


class BeamOptionsError(RecpipeError, ValueError):
    pass


def _normalized(args: list[str]) -> list[str]:
    """--opt value -> --opt=value for recpipe's short forms; aliases expanded."""
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name in ("--runner", "--dask-address") and not eq and i + 1 < len(args):
            value, i = args[i + 1], i + 1
        if name == "--runner" and (eq or value):
            arg = f"--runner={_RUNNER_ALIASES.get(value.lower(), value)}"
        elif name == "--dask-address":
            arg = f"--dask_client_address={value}"
        out.append(arg)
        i += 1
    return out


def _runner(args: list[str]) -> str:
    return next((a.split("=", 1)[1] for a in args if a.startswith("--runner=")), "")


def beam_args_with_defaults(extra: list[str] | None = None) -> list[str]:
    """The user's Beam options (short forms expanded), completed with the defaults they do not
    override (a runner other than DirectRunner takes none of the DirectRunner defaults)."""
    extra = _normalized(list(extra or []))
    given = {x.split("=", 1)[0] for x in extra if x.startswith("--")}
    if "--runner" in given and _runner(extra) != "DirectRunner":
        return extra
    return [d for d in DEFAULT_BEAM_ARGS if d.split("=", 1)[0] not in given] + extra


def pipeline_runner(options: PipelineOptions) -> Optional[PipelineRunner]:
    """The runner to hand `beam.Pipeline` for these options, or None to let Beam resolve `--runner`.

    For DirectRunner it is the in-process FnApiRunner, the one Beam's DirectRunner runs a batch job
    like ours on, given the same options (so `--direct_running_mode` and `--direct_num_workers` still
    apply). Beam's DirectRunner first tries the job on Prism: it downloads Prism's binary from GitHub
    at run time and, where that works, runs the job on a runner this project never tested; where it
    cannot (no route to GitHub) it falls back after a failed fetch, leaving an empty
    `$TMPDIR/beam-temp*` folder behind on every run. Prism stays one flag away: `--runner=PrismRunner`."""
    if options.view_as(StandardOptions).runner not in (None, "DirectRunner"):
        return None
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    # as Beam's DirectRunner builds it: the provision info carries the options to the SDK workers
    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    return fn_runner.FnApiRunner(provision_info=fn_runner.ExtendedProvisionInfo(
        beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)))


def unknown_options(args: list[str]) -> list[str]:
    """The flags in `args` that no registered Beam PipelineOptions class declares."""
    args = _normalized(args)
    if _runner(args) == DASK_RUNNER:
        import recpipe.pipeline.dask_runner  # noqa: F401  (registers Beam's DaskOptions; dask is imported only for it)
    found: list[str] = []

    def collect(parser) -> None:
        found.extend(a.split("=", 1)[0] for a in parser.parse_known_args(args)[1] if a.startswith("-"))

    PipelineOptions(args).get_all_options(add_extra_args_fn=collect, retain_unknown_options=True)
    return found


def check_beam_args(args: list[str], also_known: tuple[str, ...] = ()) -> None:
    """Raise naming every unknown option, with the closest known ones (`also_known`: the caller's
    own flags, e.g. recpipe preprocess's, so a typo of one of them is recognised too)."""
    unknown = unknown_options(args)
    if not unknown:
        return
    known: list[str] = list(also_known)
    PipelineOptions([]).get_all_options(add_extra_args_fn=lambda p: known.extend(
        s for a in p._actions for s in a.option_strings), retain_unknown_options=True)
    hints = []
    for flag in unknown:
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
        hints.append(f"{flag}" + (f" (did you mean {close[0]}?)" if close else ""))
    raise BeamOptionsError(f"unknown option(s): {', '.join(hints)}: neither a recpipe preprocess option nor a "
                           f"Beam pipeline option")
