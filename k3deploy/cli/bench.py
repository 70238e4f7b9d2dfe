"""``k3deploy bench INVENTORY``: a load test of the serving endpoint with vLLM's own client (``vllm bench serve``,
from the engines' image on the first engine node), a concurrency sweep (``k3_bench_*``: InferenceX's 1k/1k by
default), recorded with the revision each group serves (``k3deploy history`` shows it); ``--svg`` draws every
recorded revision's sweep (output tokens/s per GPU against latency, one line per revision).

Example::

    $ k3deploy bench inventories/gb300.py
    $ k3deploy bench inventories/gb300.py --json | jq '."16".ttft_ms.p99'
    $ k3deploy bench inventories/gb300.py --svg bench.svg
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from k3deploy.cli.common import json_option
from k3deploy.errors import K3Error


@click.command("bench")
@click.argument("inventory")
@click.option("--svg", "svg_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write a picture (SVG) of every recorded revision's benchmark, this one included.")
@json_option
def bench(inventory: str, svg_path: str | None, as_json: bool) -> None:
    """Benchmark the serving endpoint: vLLM's 'vllm bench serve' from the engines' own image on the first engine
    node (the control machine needs nothing new), the random dataset at k3_bench_input_tokens in and
    k3_bench_output_tokens out, one run per k3_bench_concurrency; TTFT, ITL and end-to-end latency at p50/p95/p99,
    output tokens/s and per GPU. Kept with the revision each engine group serves (bench.json in its revision
    directory; k3deploy history shows it). --json: per concurrency, {ttft_ms: {p50, p99}, itl_ms: {p50, p99},
    output_tokens_per_s}. Exits 1 when the client could not finish the sweep (nothing is recorded then)."""
    from k3deploy.model import bench as model
    from k3deploy.runtime.bench import bench as run_bench

    try:
        result = run_bench(inventory)
    except K3Error:
        raise
    except Exception as exc:  # never a traceback for the user
        raise K3Error(f"bench could not run: {type(exc).__name__}: {exc}") from None
    if svg_path is not None and result.ok:
        series: dict[str, model.Record] = {}
        for g, h in result.history.items():
            for n in h.numbers:
                rec = (result.record if result.kept.get(g) == n
                       else model.Record.from_json(h.benches[n]) if n in h.benches else None)
                if rec is not None and rec.points:
                    series[f"{g} rev {n}"] = rec
        Path(svg_path).write_text(model.svg(series))
    if as_json:
        click.echo(json.dumps(result.summary(), indent=2, sort_keys=True))
    else:
        click.echo(f"{model.CLIENT} from {result.node} against {result.record.endpoint}: "
                   f"{result.record.load.line()}, {result.record.gpus} GPUs")
        for p in result.record.points:
            click.echo(f"  {p.line()}")
        if result.kept:
            click.echo("kept with " + ", ".join(f"{g} revision {n}" for g, n in result.kept.items())
                       + " (k3deploy history shows it)")
        if svg_path is not None and result.ok:
            click.echo(f"picture: {svg_path}")
    if not result.ok:
        click.echo(f"bench: {result.why} (nothing recorded)", err=True)
        sys.exit(1)
