"""Run the dataset experiments for docs/results.md, store their outputs, render the document.

    .venv/bin/python scripts/results.py run accuracy attention --seeds 0,1,2 --n 240
    .venv/bin/python scripts/results.py run accuracy:0,1@96 bias:0 --n 24   # seeds, n per entry
    .venv/bin/python scripts/results.py render          # docs/results/*.json → docs/results.md
    .venv/bin/python scripts/results.py run heads --demos-per-label 8 --labels meaningful \
        --out docs/results/meaningful-16                # another design, in its own folder
    .venv/bin/python scripts/results.py render --results docs/results/meaningful-16 \
        --out docs/results-meaningful-16.md

`run` loads the model once, runs each experiment under each seed (counterbalanced design unless
`--design fftt`), combines the seeds (model_worker.experiments.seeds) and stores the result in
`docs/results/NAME.json`, with how it ran (command, CPU, cores, nice, load average before and
after, wall and CPU seconds, when it finished); `render` writes docs/results.md from those
files only, so rerunning it on the same files gives the same bytes. A folder's `preface.md`,
if any, comes first (what its design changes from the paper's).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from icl_heads.results_doc import document, store  # noqa: E402

RESULTS = ROOT / "docs" / "results"
DOCUMENT = ROOT / "docs" / "results.md"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown CPU" elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def run(args: argparse.Namespace) -> None:
    from model_worker.contracts.experiments import ExperimentRequest
    from model_worker.experiments.job import run_keeping
    from model_worker.experiments.seeds import combine_seeds, parse_seeds
    from model_worker.model.loading import load_model

    loaded = load_model(args.model)
    for entry in args.names:
        entry, _, own_n = entry.partition("@")
        name, _, own_seeds = entry.partition(":")
        seeds = parse_seeds(own_seeds or args.seeds)
        n = int(own_n) if own_n else args.n
        started, cpu_started = time.perf_counter(), time.process_time()
        load_before = os.getloadavg()[0]
        results, kept = [], []
        for seed in seeds:
            request = ExperimentRequest(
                name=name,
                dataset=args.dataset,
                n=n,
                seed=seed,
                design=args.design,
                demos_per_label=args.demos_per_label,
                labels=args.labels,
            )
            result, intervals = run_keeping(loaded, request, batch_size=args.batch_size)
            results.append(result)
            kept.append(intervals)
            print(f"{name} seed {seed}: {time.perf_counter() - started:.0f} s", flush=True)
        run_info = {
            "command": f"scripts/results.py run {name}:{','.join(map(str, seeds))}@{n} "
            f"--dataset {args.dataset} --design {args.design} --batch-size {args.batch_size}"
            + (f" --demos-per-label {args.demos_per_label}" if args.demos_per_label != 2 else "")
            + (f" --labels {args.labels}" if args.labels != "arbitrary" else "")
            + (f" --out {args.out}" if Path(args.out) != RESULTS else ""),
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "nice": os.nice(0),
            "load_before": round(load_before, 1),
            "load_after": round(os.getloadavg()[0], 1),
            "wall_s": round(time.perf_counter() - started),
            "cpu_s": round(time.process_time() - cpu_started),
            "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        path = store(combine_seeds(results, kept), Path(args.out), run=run_info)
        print(f"stored {path}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    runner = commands.add_parser("run", help="run experiments and store their results")
    runner.add_argument("names", nargs="+", help="NAME[:SEEDS][@N], e.g. accuracy:0,1@96")
    runner.add_argument("--seeds", default="0,1,2")
    runner.add_argument("--n", type=int, default=240)
    runner.add_argument("--dataset", default="sentiment-number")
    runner.add_argument("--design", default="counterbalanced", choices=("counterbalanced", "fftt"))
    runner.add_argument("--demos-per-label", type=int, default=2, choices=(2, 4, 8))
    runner.add_argument("--labels", default="arbitrary", choices=("arbitrary", "meaningful"))
    runner.add_argument("--model", default=None)
    runner.add_argument("--batch-size", type=int, default=16)
    runner.add_argument("--out", default=str(RESULTS))
    renderer = commands.add_parser("render", help="write docs/results.md from stored results")
    renderer.add_argument("--results", default=str(RESULTS))
    renderer.add_argument("--out", default=str(DOCUMENT))
    args = parser.parse_args()
    if args.command == "run":
        run(args)
    else:
        Path(args.out).write_text(document(Path(args.results)), encoding="utf-8")


if __name__ == "__main__":
    main()
