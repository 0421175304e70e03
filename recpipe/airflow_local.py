"""Run the recpipe_daily DAG on a real, local Airflow (its own AIRFLOW_HOME with a sqlite metadata DB):
`dag.test` runs every task of one logical day in order, in a fresh Python process per day, as the
scheduler would. For the tests and the benchmarks; a deployment runs the DAG in its own Airflow.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["LocalAirflow", "DAGS"]

DAGS = Path(__file__).resolve().parents[1] / "airflow_dags"

_RUN = """
import json, sys, pendulum
from airflow.dag_processing.dagbag import DagBag
dag = DagBag(sys.argv[1]).dags["recpipe_daily"]
dr = dag.test(logical_date=pendulum.parse(sys.argv[2]), run_conf={"project": sys.argv[3], "recpipe_bin": sys.argv[4]})
print("RESULT " + json.dumps({"state": str(dr.state),
                              "tasks": {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}}))
"""


class LocalAirflow:
    def __init__(self, home: str):
        bin_dir = Path(sys.executable).parent
        self.home = home
        self.env = dict(os.environ, AIRFLOW_HOME=home, AIRFLOW__CORE__LOAD_EXAMPLES="False",
                        AIRFLOW__CORE__DAGS_FOLDER=str(DAGS), TF_CPP_MIN_LOG_LEVEL="3",
                        PATH=f"{bin_dir}:{os.environ['PATH']}")
        self.recpipe = str(bin_dir / "recpipe")

    def migrate(self) -> "LocalAirflow":
        """Create the metadata DB (once per home)."""
        os.makedirs(self.home, exist_ok=True)
        subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=self.env, check=True,
                       capture_output=True, timeout=300)
        return self

    def run_day(self, project: str, day: str, timeout: int = 1800) -> dict:
        """dag.test of one logical day: {"state", "tasks": {task_id: state}}; raises with the output's
        tail when the run did not report."""
        proc = subprocess.run([sys.executable, "-c", _RUN, str(DAGS), day, project, self.recpipe], env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"airflow dag.test {day}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n"
                               f"{proc.stderr[-3000:]}")
        return json.loads(lines[-1][len("RESULT "):])
