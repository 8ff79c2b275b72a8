"""This tree's Conveyor beside an older commit's, on the same services: worker sets
alternate between the two, cycle after cycle, and each figure is the median over cycles.

    python -m benchmarks.ab REF [--figure fanout|map|chain|latency] [--fanout 200]
                                [--chain 40] [--cycles 4] [--runs 3] [--json ab.json]

Why: this machine's speed drifts by 15 to 30 % within minutes, so two runs of
``python -m benchmarks`` minutes apart cannot tell a change of 5 or 10 % from the drift (a
session's "gain" of that size came out as noise when measured this way). Here the two codes
take turns every few seconds, so the drift falls on both.

The older commit is checked out in a git worktree; its workers import its ``conveyor`` and
``benchmarks`` packages and this environment's libraries (``python -S``, so that the editable
install of this tree is not found first). Both codes run against this tree's schema: compare
commits whose migrations agree, and whose ``benchmarks/nodes.py`` has the node functions used
(``bench.noop``, ``bench.started``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import site
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks import chains, compare, harness, maps
from benchmarks.bench import Bench
from conveyor.engine.validation import parse_workflow

LATENCY_RUNS = 150  # sequential triggers per side and cycle (the first five warm up)


@contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """The commit ``ref`` checked out beside this tree, removed afterwards."""
    parent = Path(tempfile.mkdtemp(prefix="conveyor-ab-"))
    path = parent / "tree"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(path), ref],
        cwd=harness.ROOT, check=True, capture_output=True,
    )  # fmt: skip
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(path)],
            cwd=harness.ROOT, check=False, capture_output=True,
        )  # fmt: skip
        shutil.rmtree(parent, ignore_errors=True)


class Side:
    """One code: how and where its workers are started."""

    def __init__(self, name: str, env: dict[str, str], python: Sequence[str], cwd: Path) -> None:
        self.name, self.env, self.python, self.cwd = name, env, python, cwd


def sides(bench: Bench, old_root: Path) -> list[Side]:
    """This tree's side, and the old commit's: its tree first on the path (``-m`` puts the
    working directory there too), then this environment's libraries."""
    libraries = ":".join(site.getsitepackages())
    env = {**bench.env, "PYTHONPATH": f"{old_root}:{libraries}"}
    old = Side("old", env, (sys.executable, "-S"), old_root)
    imported = subprocess.run(
        [*old.python, "-c", "import conveyor, benchmarks; print(conveyor.__file__)"],
        env=old.env, cwd=old.cwd, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    if not imported.startswith(str(old_root)):
        raise RuntimeError(f"the old side would import {imported}, not the worktree's conveyor")
    return [Side("this tree", bench.env, (sys.executable,), harness.ROOT), old]


def fanout_runs(bench: Bench, n: int, runs: int, one: Callable[[Bench, int], float]) -> list[float]:
    """``runs`` fan-outs (``one``: a static one, or a map; or chains) of ``n`` (ms per node,
    item or step)."""
    one(bench, n)  # untimed: connections, imports, definition caches
    return [one(bench, n) * 1000 for _ in range(runs)]


def latency_p50(bench: Bench, key: str) -> float:
    """The median trigger -> node start of sequential runs on idle workers (ms)."""
    found = [compare.conveyor_latency(bench, key)[0] for _ in range(LATENCY_RUNS)]
    return statistics.median(found[5:]) * 1000  # the first five warm up


def measure(
    bench: Bench, both: list[Side], cycles: int, one: Callable[[str], list[float]]
) -> dict[str, list[float]]:
    """Each cycle starts each side's workers in turn and takes its figures, each side on
    tables at rest (Bench.at_rest): not on the dead rows the other side just left."""
    found: dict[str, list[float]] = {side.name: [] for side in both}
    for cycle in range(cycles):
        for side in both:
            bench.at_rest()
            with bench.conveyor_workers(side.env, side.python, side.cwd):
                found[side.name].extend(one(f"{cycle}{side.name}"))
    return found


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("ref", help="the older commit (any git revision)")
    parser.add_argument("--figure", choices=["fanout", "map", "chain", "latency"], default="fanout")
    parser.add_argument("--fanout", type=int, default=200, help="fan-out width (map: items)")
    parser.add_argument("--chain", type=int, default=40, help="steps of the chain")
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3, help="fan-out runs per side and cycle")
    parser.add_argument("--concurrency", type=int, default=4, help="processes per node pool")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)

    with harness.services() as svc, worktree(args.ref) as old_root:
        bench = Bench(svc, args.concurrency)
        if args.figure in ("fanout", "map"):
            static = args.figure == "fanout"
            definition = compare.fanout_definition(args.fanout) if static else maps.DEFINITION
            bench.client.apply(parse_workflow(definition))
            unit = "ms per node" if static else "ms per item"
            one = compare.conveyor_fanout if static else maps.conveyor_map
            found = measure(bench, sides(bench, old_root), args.cycles,
                            lambda _: fanout_runs(bench, args.fanout, args.runs, one))  # fmt: skip
        elif args.figure == "chain":
            bench.client.apply(parse_workflow(chains.definition(args.chain)))
            unit = "ms per step"
            found = measure(bench, sides(bench, old_root), args.cycles,
                            lambda _: fanout_runs(bench, args.chain, args.runs,
                                                  chains.conveyor_chain))  # fmt: skip
        else:
            bench.client.apply(parse_workflow(compare.STARTED))
            unit = "ms, trigger -> node start p50"
            found = measure(bench, sides(bench, old_root), args.cycles,
                            lambda key: [latency_p50(bench, f"bench:ab:{key}")])  # fmt: skip
        bench.database.dispose()
        bench.redis.close()

    medians = {name: statistics.median(values) for name, values in found.items()}
    results = {"params": vars(args), "unit": unit, "values": found, "medians": medians,
               "this_over_old": medians["this tree"] / medians["old"]}  # fmt: skip
    for name, values in found.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:10s} median {medians[name]:7.2f} {unit}  ({shown})")
    print(f"this tree / {args.ref}: x{results['this_over_old']:.3f}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
