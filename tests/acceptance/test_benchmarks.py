"""The benchmarks still run (at a tiny size: they are measurements, never timed tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import ROOT
from tests.conftest import REDIS_SERVER


def run_benchmark(out: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    """Run a benchmark module (``args``: its name and options), its figures written to
    ``out``, on the tests' Redis server: its output and the figures, once it exited cleanly."""
    result = subprocess.run(
        [sys.executable, "-m", *args, "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "BENCH_REDIS_SERVER": REDIS_SERVER},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result, json.loads(out.read_text())


def test_the_limits_benchmark_runs_and_writes_its_figures(tmp_path: Path) -> None:
    result, figures = run_benchmark(
        tmp_path / "limits.json", "benchmarks.limits", "--executions", "20", "--pairs", "50",
        "--concurrency", "2",
    )  # fmt: skip
    assert set(figures["throughput"]) == {"limits_on", "limits_off", "raw_celery"}
    assert all(v > 0 for v in figures["ratios"].values())
    assert "of raw" in result.stdout


def test_the_schedules_benchmark_runs_and_writes_its_figures(tmp_path: Path) -> None:
    result, figures = run_benchmark(
        tmp_path / "schedules.json", "benchmarks.schedules", "--schedules", "500", "--due", "20",
        "--rounds", "1",
    )  # fmt: skip
    assert figures["due"] == 20 and len(figures["check_seconds"]) == 1
    assert figures["ratios"]["check_vs_raw_publish"] > 0
    assert "of raw" in result.stdout


def test_the_comparison_benchmark_runs_every_figure_and_writes_its_ratios(tmp_path: Path) -> None:
    result, figures = run_benchmark(
        tmp_path / "compare.json", "benchmarks", "--fanout", "5", "--executions", "20",
        "--latency-runs", "5", "--wait-runs", "3", "--scale-rows", "200", "--scale-map", "30",
        "--concurrency", "2", "--rounds", "1", "--chain", "3",
    )  # fmt: skip
    found = figures["figures"]
    assert set(found) == {
        "fanout_5", "map_5", "chain_3", "throughput", "latency", "waits", "scale", "map_scale",
    }  # fmt: skip
    assert set(figures["ratios"]) >= {
        "fanout_5_per_node", "map_5_per_item", "map_5_of_static", "chain_3_per_step",
        "throughput_of_raw", "latency_node_start_p50", "latency_node_start_p99",
        "latency_completed_p50", "scale_of_empty", "waits_p50", "waits_p99",
    }  # fmt: skip
    # the waits' figure: one event -> successor time per run, beside the raw relay's
    assert len(figures["raw_waits"]["event_to_start"]) == 3
    assert len(figures["raw_waits"]["raw_relay_start"]) == 3
    # the chain ran beside a raw Celery chain, round for round
    assert len(found["chain_3"]["conveyor_rounds"]) == len(found["chain_3"]["raw_rounds"]) == 1
    assert all(v > 0 for v in figures["ratios"].values())
    # the map ran in the fan-out's rounds, beside its chord over the same list
    assert len(found["map_5"]["conveyor_rounds"]) == len(found["map_5"]["raw_rounds"]) == 1
    assert len(figures["raw_latencies"]["trigger_to_node_start"]) == 5
    # the sweep deleted the executions loaded a day old, and kept those the figures ran
    assert found["scale"]["pruned"] == 200
    # the scale's map: timed, with the peak RSS of the trigger's process and of each worker's
    # (the planner's and the node pool's main processes, and their pools' processes)
    scale = found["map_scale"]
    assert scale["items"] == 30 and scale["seconds"] > 0 and scale["trigger_rss_mb"] > 0
    processes = [w["process"] for w in scale["workers"]]
    assert {"workflow-execution, main", "workflow-node, main"} <= set(processes), processes
    assert any(p.startswith("workflow-node, pool") for p in processes), processes
    assert all(w["peak_rss_mb"] >= w["ready_rss_mb"] > 0 for w in scale["workers"])
    assert "raw Celery" in result.stdout and "target" in result.stdout
    assert "map 5: per item" in result.stdout and "map of 30 items" in result.stdout
    assert "event->waiting node's successor p99" in result.stdout
    assert "chain of 3: per step" in result.stdout


def test_the_ab_benchmark_runs_an_older_commit_s_workers_beside_this_tree_s(
    tmp_path: Path,
) -> None:
    result, figures = run_benchmark(
        tmp_path / "ab.json", "benchmarks.ab", "HEAD", "--fanout", "5", "--cycles", "1",
        "--runs", "1", "--concurrency", "2",
    )  # fmt: skip
    assert set(figures["values"]) == {"this tree", "old"}
    assert all(len(v) == 1 and v[0] > 0 for v in figures["values"].values())
    assert "this tree / HEAD" in result.stdout
    listed = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True)
    assert "conveyor-ab-" not in listed.stdout  # the worktree is gone


def test_the_ab_benchmark_runs_the_chain_figure(tmp_path: Path) -> None:
    result, figures = run_benchmark(
        tmp_path / "ab.json", "benchmarks.ab", "HEAD", "--figure", "chain", "--chain", "3",
        "--cycles", "1", "--runs", "1", "--concurrency", "2",
    )  # fmt: skip
    assert figures["unit"] == "ms per step"
    assert all(len(v) == 1 and v[0] > 0 for v in figures["values"].values())
    assert "this tree / HEAD" in result.stdout


def test_the_batching_benchmark_runs_both_sides_and_writes_its_figures(tmp_path: Path) -> None:
    result, figures = run_benchmark(
        tmp_path / "batching.json", "benchmarks.batching", "--rounds", "1", "--width", "10",
    )  # fmt: skip
    assert set(figures["medians"]) == {"on", "off"}
    for side in figures["medians"].values():
        assert side["wide_s_per_node"] > 0 and side["slow_total_s"] > 0.04
    assert "batching on" in result.stdout


def test_the_cpu_benchmark_finds_every_side_s_processes_and_writes_their_cpu(
    tmp_path: Path,
) -> None:
    result, figures = run_benchmark(
        tmp_path / "cpu.json", "benchmarks.cpu", "--executions", "200", "--rounds", "1",
        "--concurrency", "2",
    )  # fmt: skip
    ours, raw = figures["conveyor_ms_per_node"], figures["raw_ms_per_node"]
    # Each group's processes were found and spent CPU on the drain: the node worker's main
    # process and its pool on both sides, PostgreSQL and Redis for Conveyor.
    for group in ("node worker, main", "node worker, pool", "PostgreSQL", "Redis"):
        assert ours[group] > 0, (group, ours)
    assert raw["node worker, main"] > 0 and raw["node worker, pool"] > 0, raw
    assert raw["PostgreSQL"] == 0  # raw Celery has no database
    assert "CPU per node" in result.stdout


@pytest.mark.parametrize("shape", ["fanout", "chain"])
def test_the_cpu_benchmark_measures_fan_outs_and_chains_against_celery_s(
    tmp_path: Path, shape: str
) -> None:
    result, figures = run_benchmark(
        tmp_path / "cpu.json", "benchmarks.cpu", f"--{shape}", "10", "--executions", "120",
        "--rounds", "1", "--concurrency", "2",
    )  # fmt: skip
    ours, raw = figures["conveyor_ms_per_node"], figures["raw_ms_per_node"]
    # ten fan-outs of ten members (and their roots and joins) against ten chords of ten tasks,
    # or twelve chains of ten steps against twelve Celery chains; CPU is counted in ticks of
    # 10 ms, too coarse for what Redis spends on so few (the drain's test finds its process)
    for group in ("node worker, main", "node worker, pool", "PostgreSQL"):
        assert ours[group] > 0, (group, ours)
    assert raw["node worker, pool"] > 0 and raw["PostgreSQL"] == 0, raw
    assert figures["params"][shape] == 10
    assert "CPU per node" in result.stdout


def test_the_ui_benchmark_runs_and_writes_its_figures(tmp_path: Path) -> None:
    result, figures = run_benchmark(
        tmp_path / "ui.json", "benchmarks.ui", "--executions", "500", "--requests", "2",
        "--throughput", "10", "--clients", "2", "--concurrency", "2",
    )  # fmt: skip
    assert figures["executions"] == 500
    assert set(figures["pages"]) == {"executions_list", "executions_list_failed", "execution_page"}
    assert all(p["p95_ms"] >= p["p50_ms"] > 0 for p in figures["pages"].values())
    assert figures["ratios"]["live_pages_of_none"] > 0
    assert "2 live pages" in result.stdout
