"""recpipe_daily: wait for a day's click-log partition -> preprocess -> train -> evaluate -> bless -> push.

Thin on purpose: no TensorFlow, no paths. Each task runs `recpipe daily STEP --project P --day {{ ds }}`
(recpipe/daily.py), where P is the project YAML (log_root, work_root, export_base, config, train: {strategy,
precision, np, steps, ...}, bless_tolerance). P and the recpipe executable come from the run's params or,
when absent, from the Airflow Variables `recpipe_project` and `recpipe_bin`.
"""
from __future__ import annotations

import subprocess
from datetime import timedelta

import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.sensors.python import PythonSensor
from airflow.sdk import DAG, CronDataIntervalTimetable, Param

# Run params reach the shell only as environment variables, never as text spliced into the command:
# a param holding a quote or `;` stays one argument.
ENV = {"RECPIPE_BIN": "{{ params.recpipe_bin or var.value.get('recpipe_bin', 'recpipe') }}",
       "RECPIPE_PROJECT": "{{ params.project or var.value.get('recpipe_project') }}",
       "RECPIPE_DAY": "{{ ds }}"}
RETRIES = {"retries": 3, "retry_delay": timedelta(minutes=2), "retry_exponential_backoff": True,
           "max_retry_delay": timedelta(minutes=30)}


def _command(step: str) -> str:
    return f'"$RECPIPE_BIN" daily {step} --project "$RECPIPE_PROJECT" --day "$RECPIPE_DAY"'


def _partition_ready(recpipe_bin: str, project: str, day: str) -> bool:
    """The sensor's probe: `recpipe daily ready` as an argument list (no shell)."""
    return subprocess.run([recpipe_bin, "daily", "ready", "--project", project, "--day", day]).returncode == 0


def _step(step: str, **kwargs) -> BashOperator:
    return BashOperator(task_id=step, bash_command=_command(step), env=ENV, append_env=True, **RETRIES, **kwargs)


with DAG(
    dag_id="recpipe_daily",
    description="Daily training: preprocess -> train -> evaluate -> bless -> push",
    # The run for day D starts when D has ended, and {{ ds }} is D. Airflow 3 reads a bare "@daily" as a
    # CronTriggerTimetable instead: the run for D would start at D's first second, waiting on (or reading) a
    # partition its writer has only begun.
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={"project": Param(None, type=["null", "string"], description="project YAML path"),
            "recpipe_bin": Param(None, type=["null", "string"], description="recpipe executable")},
    tags=["recpipe"],
) as dag:
    wait = PythonSensor(task_id="wait_for_partition", python_callable=_partition_ready,
                        op_kwargs={"recpipe_bin": ENV["RECPIPE_BIN"], "project": ENV["RECPIPE_PROJECT"],
                                   "day": ENV["RECPIPE_DAY"]}, mode="reschedule", poke_interval=300, timeout=12 * 3600)
    # depends_on_past: a day's vocabularies and warm start need the previous day's outputs.
    preprocess = _step("preprocess", depends_on_past=True)
    train = _step("train", depends_on_past=True)
    wait >> preprocess >> train >> _step("evaluate") >> _step("bless") >> _step("push")
