"""recpipe_daily: wait for a day's click-log partition -> preprocess -> train -> evaluate -> bless -> push.

Thin on purpose: no TensorFlow, no paths. Each task runs `recpipe daily STEP --project P --day {{ ds }}`
(recpipe/daily.py), where P is the project YAML (log_root, work_root, model_base, config, train: {strategy,
precision, np, steps, ...}, bless_tolerance). P and the recpipe executable come from the run's params or,
when absent, from the Airflow Variables `recpipe_project` and `recpipe_bin`.
"""
from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.sensors.bash import BashSensor
from airflow.sdk import DAG, Param

RECPIPE = "{{ params.recpipe_bin or var.value.get('recpipe_bin', 'recpipe') }}"
PROJECT = "{{ params.project or var.value.get('recpipe_project') }}"
RETRIES = {"retries": 3, "retry_delay": timedelta(minutes=2), "retry_exponential_backoff": True,
           "max_retry_delay": timedelta(minutes=30)}


def _command(step: str) -> str:
    return f"{RECPIPE} daily {step} --project '{PROJECT}' --day '{{{{ ds }}}}'"


def _step(step: str, **kwargs) -> BashOperator:
    return BashOperator(task_id=step, bash_command=_command(step), **RETRIES, **kwargs)


with DAG(
    dag_id="recpipe_daily",
    description="Daily training: preprocess -> train -> evaluate -> bless -> push",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={"project": Param(None, type=["null", "string"], description="project YAML path"),
            "recpipe_bin": Param(None, type=["null", "string"], description="recpipe executable")},
    tags=["recpipe"],
) as dag:
    wait = BashSensor(task_id="wait_for_partition", bash_command=_command("ready"), mode="reschedule",
                      poke_interval=300, timeout=12 * 3600)
    # depends_on_past: a day's vocabularies and warm start need the previous day's outputs.
    preprocess = _step("preprocess", depends_on_past=True)
    train = _step("train", depends_on_past=True)
    wait >> preprocess >> train >> _step("evaluate") >> _step("bless") >> _step("push")
