"""Which designs and tasks does the default model do in context? Accuracy with exact intervals.

    .venv/bin/python scripts/task_survey.py                      # every design, --n prompts each
    .venv/bin/python scripts/task_survey.py --n 400 --only animal-country/16/meaningful
    .venv/bin/python scripts/task_survey.py render               # docs/task_survey.json → .md

Two kinds of design:
- classification (the paper's): each built-in dataset, 4, 8 or 16 demonstrations (half true,
  half false, counterbalanced as `model_worker.datasets.prompts` describes), labelled foo/bar
  ("arbitrary", the paper's) or with each class's name ("meaningful"). Accuracy: the true
  label's first token beats the false label's at the last token; the gate is the experiments'
  adequacy gate (`evidence.adequacy_of`: the 95% interval's lower bound above 50%);
- function-vector-style word pairs (`model_worker.datasets.function_tasks`): antonym,
  country → capital, present → past tense, 4, 8 or 16 demonstrations and a held-out query.
  Two-candidate accuracy: the answer's first token beats that of the nearest demonstration's
  answer (copying it is the positional strategy), gated like the classification designs;
  vocabulary accuracy: the answer's first token is the argmax over the vocabulary (Todd et
  al.'s measure).

Each cell reports its accuracies with Clopper–Pearson 95% intervals, n, and wall seconds; the
classification cells also the accuracy when the demonstration nearest the query is true minus
when it is false (position). Results merge into docs/task_survey.json (a rerun of a cell with
more prompts replaces it) with the CPU and load, and render to docs/task_survey.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from model_worker.datasets import BUILTIN_DATASETS, IclPrompt, build_prompts  # noqa: E402
from model_worker.datasets.builtin import load_builtin  # noqa: E402
from model_worker.datasets.function_tasks import (  # noqa: E402
    FUNCTION_TASKS,
    function_prompts,
    load_function_task,
)
from model_worker.experiments import stats  # noqa: E402
from model_worker.experiments.evidence import CHANCE, adequacy_of  # noqa: E402

JSON_PATH = ROOT / "docs" / "task_survey.json"
MD_PATH = ROOT / "docs" / "task_survey.md"
DEMONSTRATIONS = (4, 8, 16)
LABEL_STYLES = ("arbitrary", "meaningful")


def cells() -> list[str]:
    """Every design's key: `dataset/demonstrations/labels` or `task/demonstrations`."""
    keys = [
        f"{dataset}/{k}/{labels}"
        for dataset in BUILTIN_DATASETS
        for k in DEMONSTRATIONS
        for labels in LABEL_STYLES
    ]
    return keys + [f"{task}/{k}" for task in FUNCTION_TASKS for k in DEMONSTRATIONS]


def prompts_of(key: str, n: int, seed: int) -> list[IclPrompt]:
    """The prompts of design `key`."""
    parts = key.split("/")
    if parts[0] in FUNCTION_TASKS:
        return function_prompts(load_function_task(parts[0]), n, k=int(parts[1]), seed=seed)
    dataset, k, labels = parts
    return build_prompts(
        load_builtin(dataset),
        n,
        seed=seed,
        demos_per_label=int(k) // 2,
        labels="meaningful" if labels == "meaningful" else "arbitrary",
    )


def score(loaded, prompts: Sequence[IclPrompt], batch_size: int) -> list[tuple[bool, bool]]:  # type: ignore[no-untyped-def]
    """(true beats false, true is the vocabulary argmax) per prompt, at its last token: the
    experiments' tokenization and label reading (`batching`), a plain forward pass (no
    captures: the survey needs only the last token's logits)."""
    import torch

    from model_worker.experiments.batching import Prepared, make_batches
    from model_worker.model.prompting import encode_prompt, read_labels, target_id

    items = []
    for prompt in prompts:
        reading = read_labels(loaded, prompt.text, [prompt.true_label, prompt.false_label])
        encoded = encode_prompt(loaded, reading.analysed)
        true_id = target_id(loaded, prompt.text, prompt.true_label, reading)[0]
        false_id = target_id(loaded, prompt.text, prompt.false_label, reading)[0]
        items.append(Prepared(prompt, encoded.ids, (), (), true_id, false_id))
    found: list[tuple[bool, bool]] = []
    pad = loaded.tokenizer.pad_token_id or 0
    with torch.inference_mode():
        for batch in make_batches(items, batch_size, pad):
            logits = loaded.model(
                input_ids=batch.input_ids.to(loaded.device),
                attention_mask=batch.attention_mask.to(loaded.device),
            ).logits
            for row, item in enumerate(batch.items):
                last = logits[row, int(batch.last[row])]
                found.append(
                    (
                        bool(last[item.true_id] > last[item.false_id]),
                        int(last.argmax()) == item.true_id,
                    )
                )
    return found


def _interval(interval: stats.Interval) -> dict[str, float | int]:
    return {"estimate": interval.estimate, "low": interval.low, "high": interval.high}


def measure(loaded, key: str, n: int, seed: int, batch_size: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """One design's cell: accuracies with intervals, the gate, position, time."""
    started = time.perf_counter()
    prompts = prompts_of(key, n, seed)
    outcomes = score(loaded, prompts, batch_size)
    correct = [c for c, _ in outcomes]
    gate = adequacy_of(correct, "counterbalanced")
    cell: dict[str, object] = {
        "key": key,
        "n": len(prompts),
        "seed": seed,
        "accuracy": _interval(stats.rate(correct)),
        "vocab_accuracy": _interval(stats.rate([v for _, v in outcomes])),
        "passes_gate": gate.adequate,
        "wall_s": round(time.perf_counter() - started, 1),
        "example": prompts[0].text,
    }
    if key.split("/")[0] not in FUNCTION_TASKS:
        sides = [(p.arrangement[-1], float(c)) for p, c in zip(prompts, correct, strict=True)]
        near_true = [c for side, c in sides if side == "T"]
        near_false = [c for side, c in sides if side == "F"]
        position = stats.bootstrap_diff(near_true, near_false, paired=False)
        cell["position"] = _interval(position)
    return cell


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def _pct(interval: dict[str, float]) -> str:
    return (
        f"{100 * interval['estimate']:.1f}% "
        f"[{100 * interval['low']:.1f}, {100 * interval['high']:.1f}]"
    )


def render(data: dict[str, object]) -> str:
    """The Markdown table of the stored survey."""
    found: dict[str, dict[str, object]] = data["cells"]  # type: ignore[assignment]
    lines = [
        "# Which designs does SmolLM2-135M-Instruct do in context?",
        "",
        "<!-- Generated by `python scripts/task_survey.py render` from docs/task_survey.json: "
        "do not edit. -->",
        "",
        "Measured by `scripts/task_survey.py` (its docstring defines every column). "
        f"Chance is {CHANCE:.0%} for the two-candidate accuracy; a design **passes** the "
        "experiments' adequacy gate when that accuracy's 95% Clopper–Pearson interval lies "
        "above chance. Classification designs are counterbalanced (true and false "
        "demonstrations in every position equally often, both label assignments for foo/bar), "
        "so answering from position scores chance; *position* is the accuracy when the "
        "nearest demonstration is true minus when it is false (bootstrap interval). "
        "Function-vector tasks: the two candidates are the held-out query's answer and the "
        "nearest demonstration's answer; *vocabulary* is the answer's first token being the "
        "argmax over the whole vocabulary.",
        "",
        "| design | demos | labels | n | two-candidate accuracy | passes | vocabulary | "
        "position | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in cells():
        if key not in found:
            continue
        cell = found[key]
        parts = key.split("/")
        labels = parts[2] if len(parts) == 3 else "(answers)"
        position = cell.get("position")
        lines.append(
            f"| {parts[0]} | {parts[1]} | {labels} | {cell['n']} | "
            f"{_pct(cell['accuracy'])} | {'**yes**' if cell['passes_gate'] else 'no'} | "  # type: ignore[arg-type]
            f"{_pct(cell['vocab_accuracy'])} | "  # type: ignore[arg-type]
            f"{_pct(position) if position else '—'} | {cell['wall_s']} |"  # type: ignore[arg-type]
        )
    passing = [key for key in cells() if key in found and found[key]["passes_gate"]]
    lines += [
        "",
        f"**Pass the gate:** {', '.join(f'`{k}`' for k in passing) or 'none'}. Intervals at "
        "small n are wide: a pass is a lower bound above 50%, not a precise accuracy; and "
        f"with {len(found)} designs tried at 95% each, about one could pass by chance alone, "
        "so a pass is confirmed only by a larger sample (the experiments' own accuracy "
        "gate, e.g. docs/results-meaningful-16.md).",
        "",
        "**What ships.** The classification designs are options of every experiment "
        "(`icl-heads experiment NAME --demonstrations 4|8|16 --labels arbitrary|meaningful`, "
        "`ExperimentRequest.demos_per_label` / `labels`, the experiments page); how they "
        "depart from the paper is in [evidence.md](evidence.md). The word-pair tasks stay "
        "package data (`model_worker/datasets/function_tasks.py`) measured here and offered as "
        "a home-page preset: their answers are words, not one of two labels, so the "
        "experiments' true/false label measures do not apply to them.",
    ]
    runs: list[dict[str, object]] = data["runs"]  # type: ignore[assignment]
    lines += ["", "## Runs", ""]
    for run in runs:
        lines.append(
            f"- `{run['command']}`: {run['cells']} designs, {run['wall_s']} s wall on "
            f"{run['cpu']} ({run['cores']} cores shared with other work, nice {run['nice']}, "
            f"load average {run['load_before']} → {run['load_after']}), finished {run['finished']}"
        )
    lines += ["", "## One prompt of each design", ""]
    for key in cells():
        if key in found:
            lines.append(f"- {key}: `{found[key]['example']}`")
    return "\n".join(lines) + "\n"


def load_stored() -> dict[str, object]:
    if JSON_PATH.is_file():
        return json.loads(JSON_PATH.read_text(encoding="utf-8"))  # type: ignore[no-any-return]
    return {"model": "smollm2", "cells": {}, "runs": []}


def run(args: argparse.Namespace) -> None:
    from model_worker.model.loading import load_model

    keys = args.only or cells()
    unknown = [k for k in keys if k not in cells()]
    if unknown:
        raise SystemExit(f"error: unknown design {unknown[0]!r}; known: {', '.join(cells())}")
    loaded = load_model(args.model)
    data = load_stored()
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    for key in keys:
        cell = measure(loaded, key, args.n, args.seed, args.batch_size)
        data["cells"][key] = cell  # type: ignore[index]
        print(
            f"{key}: n={cell['n']} acc {_pct(cell['accuracy'])} "  # type: ignore[arg-type]
            f"vocab {_pct(cell['vocab_accuracy'])} pass={cell['passes_gate']} "  # type: ignore[arg-type]
            f"{cell['wall_s']} s",
            flush=True,
        )
        JSON_PATH.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    only = " ".join(f"--only {k}" for k in args.only or [])
    data["runs"].append(  # type: ignore[attr-defined]
        {
            "command": f"scripts/task_survey.py --n {args.n} --seed {args.seed} {only}".strip(),
            "cells": len(keys),
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "nice": os.nice(0),
            "load_before": round(load_before, 1),
            "load_after": round(os.getloadavg()[0], 1),
            "wall_s": round(time.perf_counter() - started),
            "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
    )
    JSON_PATH.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    MD_PATH.write_text(render(data), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", default="run", choices=("run", "render"))
    parser.add_argument("--n", type=int, default=64, help="prompts per design")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", action="append", help="a design key (repeatable)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    if args.command == "render":
        MD_PATH.write_text(render(load_stored()), encoding="utf-8")
    else:
        run(args)


if __name__ == "__main__":
    main()
