"""An experiment's report as data (schema 8): blocks of plain text, read back from a stored
schema-7 Markdown report, printed as text and written as escaped Markdown."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.views.jinja_env import ENV
from model_worker.contracts.common import RESULT_SCHEMA_VERSION
from model_worker.contracts.evidence import AdequacyOut, IntervalOut, VerdictOut
from model_worker.contracts.experiments import ExperimentResult
from model_worker.contracts.report import (
    Heading,
    Items,
    Note,
    Paragraph,
    Table,
    blocks_of,
    markdown_text,
    plain_text,
)

OLD = (
    "# Layers\n\n> **Caveat:** Only 2 prompts\n\nAttention *reads* `labels`; see [x](/logout)."
    "\n\n| layer | share |\n|---|---|\n| 3 | <img src=x onerror=alert(1)> |\n\n- one\n- two\n"
)


def stored_v7(report: str) -> dict[str, object]:
    return {
        "name": "layers",
        "model": "m",
        "dataset": "d",
        "n": 2,
        "seed": 0,
        "metrics": {},
        "tables": {},
        "figures": {},
        "report_markdown": report,
    }


def test_a_schema_7_report_is_read_as_plain_blocks() -> None:
    assert RESULT_SCHEMA_VERSION >= 8
    result = ExperimentResult.model_validate(stored_v7(OLD))
    assert result.report == [
        Heading(level=1, text="Layers"),
        Note(text="Caveat: Only 2 prompts"),
        Paragraph(text="Attention reads labels; see x."),  # markers and link targets gone
        Table(columns=["layer", "share"], rows=[["3", "<img src=x onerror=alert(1)>"]]),
        Items(items=["one", "two"]),
    ]
    dumped = result.model_dump(mode="json")
    assert "report_markdown" not in dumped
    assert ExperimentResult.model_validate(dumped) == result  # schema 8 round-trips


def test_text_and_markdown_renderings() -> None:
    blocks = blocks_of(OLD)
    text = plain_text(blocks)
    assert text.startswith("Layers\n======") and "Note: Caveat: Only 2 prompts" in text
    assert "layer  share" in text and "*" not in text
    written = markdown_text(blocks)
    assert "\\<img src=x onerror=alert(1)\\>" in written  # no markup comes back to life
    assert blocks_of(written) == blocks  # the download reads back as the same blocks


def test_the_page_escapes_the_report_and_shows_the_verdicts_as_a_view() -> None:
    interval = IntervalOut(estimate=0.4, low=0.1, high=None, n=12, method="bootstrap")
    result = ExperimentResult.model_validate(
        {
            **stored_v7(OLD),
            "verdicts": [
                VerdictOut(
                    hypothesis="<b>heads</b> read labels",
                    quantity="share",
                    interval=interval,
                    null=0.0,
                    min_effect=0.05,
                    rule="low > null + min_effect",
                    outcome="inconclusive",
                ).model_dump()
            ],
            "adequacy": AdequacyOut(
                accuracy=interval, chance=0.5, design="counterbalanced", adequate=False, note="n"
            ).model_dump(),
        }
    )
    html = ENV.get_template("partials/_verdicts.html").render(result=result)
    html += ENV.get_template("partials/_report.html").render(blocks=result.report)
    assert "<img" not in html and "<b>heads" not in html and "&lt;b&gt;heads" in html
    assert 'data-outcome="inconclusive"' in html and "low &gt; null + min_effect" in html
    assert "[0.1, undefined]" in html and 'data-adequate="false"' in html
    text = plain_text(result.report_blocks())
    assert "inconclusive" in text and "0.4 [0.1, undefined]" in text


def test_the_cli_prints_plain_text_and_writes_escaped_markdown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from icl_heads.cli.experiments import emit

    result = ExperimentResult.model_validate(stored_v7(OLD))
    emit(result, None, as_json=False)
    printed = capsys.readouterr().out
    assert printed.startswith("Layers\n======") and "<img" in printed and "**" not in printed
    emit(result, tmp_path, as_json=False)
    written = (tmp_path / "report.md").read_text()
    assert written.startswith("# Layers") and "\\<img" in written


def _gated(adequate: bool, needs_adequacy: bool = True) -> ExperimentResult:
    interval = IntervalOut(estimate=0.2, low=0.1, high=0.3, n=96, method="bootstrap", seeds=[0, 1])
    accuracy = IntervalOut(estimate=0.53, low=0.48, high=0.58, n=400, method="clopper-pearson")
    return ExperimentResult.model_validate(
        {
            **stored_v7(""),
            "verdicts": [
                VerdictOut(
                    hypothesis="true-label attention ≫ false",
                    quantity="attn_true_minus_false",
                    interval=interval,
                    null=0.0,
                    min_effect=0.05,
                    rule="r",
                    outcome="supported",
                    needs_adequacy=needs_adequacy,
                ).model_dump()
            ],
            "adequacy": AdequacyOut(
                accuracy=accuracy,
                chance=0.5,
                design="counterbalanced",
                adequate=adequate,
                note="not doing ICL on this task",
            ).model_dump(),
        }
    )


def test_a_verdict_beside_a_failed_gate_is_never_styled_as_settled() -> None:
    """Issue 38.5: a green "supported" showed directly under "the head-level results describe a
    model that is not doing ICL on this task"."""
    html = ENV.get_template("partials/_verdicts.html").render(result=_gated(adequate=False))
    assert "verdict--supported" not in html and 'data-gated="true"' in html
    assert "not a finding: the model fails the adequacy gate" in html
    assert "the measurement alone: supported" in html and "seeds 0, 1 pooled" in html
    text = plain_text(_gated(adequate=False).report_blocks())
    assert "not a finding" in text and "(the measurement alone: supported)" in text
    passed = ENV.get_template("partials/_verdicts.html").render(result=_gated(adequate=True))
    assert "verdict--supported" in passed and 'data-gated="false"' in passed
    # a claim about the model's behaviour itself (its accuracy) is read whatever the gate says
    own = ENV.get_template("partials/_verdicts.html").render(
        result=_gated(adequate=False, needs_adequacy=False)
    )
    assert "verdict--supported" in own


def test_an_interval_the_data_cannot_support_shows_why() -> None:
    from model_worker.contracts.report import interval_text

    undefined = IntervalOut(
        estimate=0.17, low=None, high=None, n=8, method="prompt bootstrap", undefined="1 of 1000"
    )
    assert interval_text(undefined) == "0.17 [undefined: 1 of 1000]"
