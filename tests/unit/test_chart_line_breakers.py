"""U+2028 and U+2029 never reach a Vega-Lite specification (issue 37.8): Vega-Lite compiles a
sort over named values into an expression whose parser ends a string at them, so a token (a
SentencePiece vocabulary can hold them) or an uploaded category with one broke the chart. They
are shown as marks, in the data and the sort alike, so the sort still matches its values."""

from __future__ import annotations

import json

import altair as alt

from app.views.figure_kit.figure import Figure
from app.views.figure_kit.text import visible


def test_a_sort_over_values_with_line_separators_is_safe() -> None:
    names = ["cat\u2028dog", "one\u2029two", "plain"]
    rows = [{"name": name, "value": float(i)} for i, name in enumerate(names)]
    chart = (
        alt.Chart(alt.Data(values=rows))
        .mark_bar()
        .encode(x=alt.X("name:N", sort=[visible(name) for name in names]), y="value:Q")
    )
    spec = Figure("tokens", "Tokens", rows, chart).spec("light")
    text = json.dumps(spec, ensure_ascii=False)
    assert "\u2028" not in text and "\u2029" not in text
    sort = spec["encoding"]["x"]["sort"]
    assert sort == ["cat⏎dog", "one¶two", "plain"]
    assert [row["name"] for row in spec["data"]["values"]] == sort  # still matching
    assert rows[0]["name"] == "cat\u2028dog"  # the CSV keeps the text as it is
