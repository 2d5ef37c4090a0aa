"""A finished result stored in parts, so that a read loads only what it shows.

An analysis is kept as its core (`core`: everything but the head details), the label-value MRR
of its detailed heads (`mrr`), and one part per detailed head (`h:L23H1`). The status poll, the
page and the panels read `core` + `mrr`; a head panel reads its one head; only the JSON API's
whole body joins all parts, as bytes (nothing is parsed). An experiment and an activation-patching
result are one part each (`body`).
Redis (a hash per result), the embedded memory and the durable store all hold these parts.
"""

from __future__ import annotations

import json

from model_worker.contracts.analysis import AnalysisCore, AnalysisResult, AnalysisSummary, LabelMrr
from model_worker.contracts.experiments import ExperimentResult
from model_worker.contracts.patching import PatchingResult
from model_worker.service.queue.keys import is_analysis

Parts = dict[str, bytes]
CORE, MRR, BODY, HEAD = "core", "mrr", "body", "h:"
#: What a summary read loads.
SUMMARY_PARTS = (CORE, MRR)
#: The message of a running analysis whose per-head stage is stored (its core part alone).
DETAILS_MESSAGE = "computing the head details"


def head_part(name: str) -> str:
    """The part holding the detail of head `name`."""
    return HEAD + name


def detail_mrr(result: AnalysisResult | AnalysisSummary) -> dict[str, list[LabelMrr]]:
    """The label-value MRR of each detailed head, in the result's order."""
    if isinstance(result, AnalysisSummary):
        return result.detail_mrr
    return {name: detail.value_mrr for name, detail in result.head_details.items()}


def analysis_parts(result: AnalysisResult) -> Parts:
    """`result` split into its core, the detailed heads' MRR, and one part per detailed head."""
    mrr = {name: [m.model_dump() for m in v] for name, v in detail_mrr(result).items()}
    parts = {
        CORE: result.model_dump_json(exclude={"head_details"}).encode(),
        MRR: json.dumps(mrr).encode(),
    }
    for name, detail in result.head_details.items():
        parts[head_part(name)] = detail.model_dump_json().encode()
    return parts


def experiment_parts(result: ExperimentResult) -> Parts:
    return {BODY: result.model_dump_json().encode()}


def result_parts(result: AnalysisResult | ExperimentResult | PatchingResult) -> Parts:
    if isinstance(result, ExperimentResult | PatchingResult):
        return {BODY: result.model_dump_json().encode()}
    return analysis_parts(result)


def heads_stage_parts(core: bytes) -> Parts:
    """The parts of a running analysis' per-head stage: its core, no detailed heads yet."""
    return {CORE: core, MRR: b"{}"}


def size(parts: Parts) -> int:
    """Bytes held by `parts` (names included)."""
    return sum(len(name) + len(value) for name, value in parts.items())


def result_json(job_id: str, parts: Parts) -> bytes:
    """The whole result's JSON, joined from its parts without parsing the head details."""
    if not is_analysis(job_id):  # an experiment or a patching result: one part
        return parts[BODY]
    order = json.loads(parts[MRR])  # the detailed heads, in the result's order
    details = b",".join(json.dumps(name).encode() + b":" + parts[head_part(name)] for name in order)
    core = parts[CORE].rstrip()
    return core[:-1] + b',"head_details":{' + details + b"}}"


def summary(parts: Parts) -> AnalysisSummary:
    """The summary (core + detailed heads' MRR) from the parts `SUMMARY_PARTS`."""
    core = AnalysisCore.model_validate_json(parts[CORE])
    mrr = {
        name: [LabelMrr.model_validate(m) for m in values]
        for name, values in json.loads(parts[MRR]).items()
    }
    return AnalysisSummary(**dict(core), detail_mrr=mrr)
