"""Explorer pages, HTMX partials, JSON twins (one panel model each, linked from the HTML views)
and figure downloads over the tiny-model backend."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any
from xml.etree import ElementTree

import pytest
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient

import app.routes.pages as page_routes
import app.routes.panels as panel_routes
from app.main import create_app
from app.page_cache import PageCache
from app.views.figure_kit.text import signed
from app.views.figures.registry import figure_entry
from app.views.panels import ANALYSIS_PANELS, Comparison, HeadOffer, HeadPanel, HeadPending
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from tests.app_clients import rendered_contexts
from tests.stages import held_head_details
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama

XSS = "<script>alert(1)</script> : foo <img src=x onerror=alert(1)> : bar one :"


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(model="tiny-llama")
    backend = embedded_backend(settings, loader=tiny_llama)
    with TestClient(create_app(settings, backend)) as test_client:
        deadline = time.monotonic() + 30  # the model loads in the worker thread
        while not all(m["ready"] for m in test_client.get("/api/models").json()):
            assert time.monotonic() < deadline, "the tiny model did not load"
            time.sleep(0.02)
        yield test_client


def soup(html: str) -> BeautifulSoup:
    return BeautifulSoup(html, "html.parser")


def wait_done(client: TestClient, job_id: str, timeout: float = 30.0) -> BeautifulSoup:
    """Polls the status partial as htmx would, until it answers with the analysis body."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = client.get(f"/a/{job_id}/status")
        assert response.status_code == 200
        page = soup(response.text)
        status = page.select_one("[data-status]")
        assert status is not None
        if status["data-status"] in ("done", "failed"):
            return page
        if status["data-status"] == "heads":
            poller = page.select_one(".details-pending")
            assert poller is not None and poller["hx-get"].endswith("&after=heads")
        else:
            assert status["hx-get"] == f"/a/{job_id}/status?wait=10"
        time.sleep(0.05)
    raise AssertionError(f"{job_id} did not finish in {timeout} s")


def analyse(client: TestClient, **form: str) -> str:
    response = client.post("/analyse", data=form, follow_redirects=False)
    assert response.status_code == 303, response.text
    location = response.headers["location"]
    assert location.startswith("/a/a-")
    job_id = location.removeprefix("/a/")
    wait_done(client, job_id)
    return job_id


@pytest.fixture(scope="module")
def job(client: TestClient) -> str:
    return analyse(client, prompt=EXAMPLE_PROMPT, target="foo", labels="foo, bar")


def test_home_has_form_models_and_presets(client: TestClient) -> None:
    page = soup(client.get("/").text)
    assert page.select_one("form.analyse-form textarea[name=prompt]") is not None
    assert [o.text.strip() for o in page.select("select[name=model] option")] == ["tiny-llama"]
    keys = [a["data-preset"] for a in page.select("a.preset")]
    assert keys == ["paper", "imbalanced", "reordered", "meaningful", "past", "sentence"]
    chosen = soup(client.get("/?preset=reordered").text)
    prompt = chosen.select_one("textarea[name=prompt]")
    assert prompt is not None and prompt.text == "eight : foo love : bar two : foo like : bar one :"
    expected = chosen.select_one("input[name=expected]")
    assert expected is not None and expected["value"] == "foo"


def test_the_page_says_whether_the_prediction_is_right(client: TestClient) -> None:
    """Given the right answer, the tokens panel says right or wrong, by the model's own
    argmax; with none (and a query no demonstration repeats), that the answer is not known."""
    job = analyse(client, prompt=EXAMPLE_PROMPT)
    assert client.get(f"/api/analyses/{job}").json()["result"]["answer"] is None
    unknown = soup(client.get(f"/a/{job}").text).select_one("[data-answer]")
    assert unknown is not None and unknown["data-answer"] == "unknown"
    assert "not known" in unknown.text
    for expected in ("foo", "bar"):
        checked = analyse(client, prompt=EXAMPLE_PROMPT, expected=expected)
        result = client.get(f"/api/analyses/{checked}").json()["result"]
        answer = result["answer"]
        assert answer["expected"] == expected and answer["source"] == "given"
        assert answer["predicted_token"] == result["target"]["token"]  # the argmax
        assert answer["correct"] == (answer["predicted_token"] == answer["expected_token"])
        shown = soup(client.get(f"/a/{checked}").text).select_one("[data-answer]")
        assert shown is not None
        assert shown["data-answer"] == ("right" if answer["correct"] else "wrong")
        assert f"expected answer given: {expected}" in shown.text
    repeated = analyse(client, prompt="one : foo two : bar one :")
    answer = client.get(f"/api/analyses/{repeated}").json()["result"]["answer"]
    assert answer["source"] == "demonstrated" and answer["expected"] == "foo"
    shown = soup(client.get(f"/a/{repeated}").text).select_one("[data-answer]")
    assert shown is not None and "the query repeats a demonstration labelled foo" in shown.text


def figure_spec(page: BeautifulSoup, name: str) -> dict[str, Any]:
    """The Vega-Lite specification of figure `name` on `page`."""
    host = page.select_one(f".vl-figure[data-figure={name}]")
    assert host is not None, f"no figure {name}"
    spec: dict[str, Any] = json.loads(str(host["data-spec"]))
    return spec


def figure_values(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The data rows a figure's specification draws."""
    if "datasets" in spec:
        (values,) = spec["datasets"].values()
        return list(values)
    return list(spec["data"]["values"])


def marks(svg: bytes, group: str) -> list[ElementTree.Element]:
    """The marks of the drawn SVG's mark group whose class names `group`."""
    root = ElementTree.fromstring(svg)
    return [
        child
        for g in root.iter("{http://www.w3.org/2000/svg}g")
        if group in (g.get("class") or "").split()
        for child in g
    ]


def test_analysis_page_shows_tokens_target_and_figures(client: TestClient, job: str) -> None:
    page = soup(client.get(f"/a/{job}").text)
    result = client.get(f"/api/analyses/{job}").json()["result"]
    tokens = page.select(".token-strip .tok[data-position]")
    assert [t.text for t in tokens] == [t["text"] for t in result["tokens"]]
    true_positions = [int(t["data-position"]) for t in page.select(".token-strip .tok--true")]
    false_positions = [int(t["data-position"]) for t in page.select(".token-strip .tok--false")]
    assert true_positions == [x["position"] for x in result["labels"] if x["is_true"]] == [8, 11]
    assert false_positions == [2, 5]
    target = page.select_one(".target")
    assert target is not None and target["data-target"] == "foo"
    assert f"p = {result['target']['prob']:.3f}" in target.text
    heatmap = figure_spec(page, "heatmap")
    cells = figure_values(heatmap)
    assert len(cells) == result["n_layers"] * result["n_heads"]
    first = result["heads"][0]
    cell = next(c for c in cells if (c["layer"], c["head"]) == (first["layer"], first["head"]))
    assert cell["increase_text"] == signed(first["increase"])
    assert cell["split"] == (
        f"label {signed(first['label_increase'])} · other {signed(first['other_increase'])}"
    )
    assert "hx-" not in json.dumps(heatmap)  # clicks are the page's script's, not the data's
    wrapper = page.select_one("[data-panel=heatmap][data-heads-url]")
    assert wrapper is not None and wrapper["data-heads-url"] == f"/a/{job}"
    assert len(figure_values(figure_spec(page, "layers"))) == 2 * result["n_layers"]
    rows = page.select("table.top-heads tbody tr")
    assert [r["data-head-name"] for r in rows] == result["top_heads"]
    mrr = result["head_details"][result["top_heads"][0]]["value_mrr"]
    shown = [td.text for td in rows[0].select("td.num")][5:]
    assert shown == [f"{m['mrr']:.2f}" for m in mrr] and len(shown) == 2
    label = rows[0].select_one("td[data-col=label]")
    assert label is not None and label.text == f"{first['label_increase']:+.3f}"


def test_rank_by_label_increase_from_the_form(client: TestClient) -> None:
    home = soup(client.get("/").text)
    options = [o["value"] for o in home.select("form.analyse-form select[name=rank_by] option")]
    assert options == ["increase", "label"]
    job_id = analyse(client, prompt=EXAMPLE_PROMPT, target="foo", rank_by="label")
    result = client.get(f"/api/analyses/{job_id}").json()["result"]
    assert result["rank_by"] == "label"
    values = [h["label_increase"] for h in result["heads"]]
    assert values == sorted(values, reverse=True)
    page = soup(client.get(f"/a/{job_id}").text)
    rows = page.select("table.top-heads tbody tr")
    assert [r["data-head-name"] for r in rows] == result["top_heads"]
    assert "ranked by label increase" in page.select_one("[data-panel=top-heads] h2").text


def test_head_panel_has_bars_and_token_tables(client: TestClient, job: str) -> None:
    result = client.get(f"/api/analyses/{job}").json()["result"]
    name = result["top_heads"][0]
    page = soup(client.get(f"/a/{job}/heads/{name}").text)
    assert page.select_one(f".head[data-head-name={name}]") is not None
    attention = figure_values(figure_spec(page, "attention"))
    assert len(attention) == len(result["tokens"])
    assert [b["kind"] for b in attention].count("true label") == 2
    assert [b["kind"] for b in attention].count("false label") == 2
    for name_ in ("increase", "margin"):
        assert len(figure_values(figure_spec(page, name_))) == len(result["tokens"])
    assert len(page.select("table[data-table=values] tbody tr")) == 4
    on_demand = page.select("table[data-table=keys] tbody tr")  # computed when asked for
    assert len(on_demand) == 1 and on_demand[0].select_one('[data-action="label-keys"]')
    detail = result["head_details"][name]
    query_chips = page.select("table[data-table=query] tr")[0].select(".chip")
    assert [c.text for c in query_chips] == detail["query"]["tokens"]
    assert len(figure_values(figure_spec(page, "scores"))) == 3 * len(result["tokens"])
    demos = page.select("table[data-table=scores] tbody tr")
    scores = detail["scores"]
    ranked = sorted(result["labels"], key=lambda label: -scores[label["position"]])
    assert [int(r["data-position"]) for r in demos] == [x["position"] for x in ranked]
    assert [r.select("td")[2].text for r in demos] == [x["demonstration"] for x in ranked]
    offsets = page.select("table[data-table=query] tr[data-offset]")
    last = len(result["tokens"]) - 1
    assert [int(r["data-offset"]) for r in offsets] == [
        last - x["position"] for x in result["labels"]
    ]


def test_head_outside_details_is_computed_on_demand(client: TestClient) -> None:
    submitted = client.post("/api/analyses", json={"prompt": EXAMPLE_PROMPT, "top_k_heads": 1})
    job_id = submitted.json()["id"]
    wait_done(client, job_id)
    result = client.get(f"/api/analyses/{job_id}").json()["result"]
    name = next(h["name"] for h in result["heads"] if h["name"] not in result["head_details"])
    assert client.get(f"/api/analyses/{job_id}/heads/{name}").status_code == 409  # not computed
    first = client.post(f"/api/analyses/{job_id}/heads/{name}")
    assert first.status_code in (200, 202)
    pending = soup(client.get(f"/a/{job_id}/heads/{name}").text)
    deadline = time.monotonic() + 30
    while (poller := pending.select_one(".status[hx-get]")) is not None:
        assert f"/a/{job_id}/heads/{name}?job=a-" in poller["hx-get"]
        assert time.monotonic() < deadline
        time.sleep(0.05)
        pending = soup(client.get(poller["hx-get"]).text)
    head = pending.select_one(f".head[data-head-name={name}]")
    assert head is not None and head["data-source"] != job_id
    twin = client.get(f"/api/analyses/{job_id}/heads/{name}?job={head['data-source']}")
    assert twin.status_code == 200
    assert twin.json()["detail"]["name"] == name
    # the second analysis is the first one's request with the head added, not a reconstruction
    asked = result["request"]
    assert asked["prompt"] == EXAMPLE_PROMPT and asked["top_k_heads"] == 1
    assert asked["labels"] is None and asked["extra_heads"] == []
    extra = client.get(f"/api/analyses/{head['data-source']}").json()["result"]["request"]
    assert extra == {**asked, "model": result["model"], "extra_heads": [name]}
    svg = client.get(f"/figures/{head['data-source']}/heads/{name}/attention.svg")
    assert svg.status_code == 200
    scores = client.get(f"/figures/{head['data-source']}/heads/{name}/scores.csv").text
    assert scores.splitlines()[0] == (
        "position,token,kind,score,content_score,position_score,attention"
    )


def test_panels_and_json_twins(client: TestClient, job: str) -> None:
    result = client.get(f"/api/analyses/{job}").json()["result"]
    for panel, selector in [
        ("tokens", ".token-strip"),
        ("layers", ".vl-figure[data-figure=layers][data-spec]"),
        ("flow", ".vl-figure[data-figure=flow][data-spec]"),
        ("heatmap", ".vl-figure[data-figure=heatmap][data-spec]"),
        ("top-heads", "table.top-heads"),
    ]:
        response = client.get(f"/a/{job}/panels/{panel}")
        assert response.status_code == 200
        assert soup(response.text).select_one(selector) is not None, panel
        assert client.get(f"/api/analyses/{job}/{panel}").status_code == 200
    heatmap = client.get(f"/api/analyses/{job}/heatmap").json()
    assert len(heatmap["heads"]) == heatmap["n_layers"] * heatmap["n_heads"]
    layers = client.get(f"/api/analyses/{job}/layers").json()["layers"]
    assert layers == [pytest.approx(x, rel=1e-5, abs=1e-7) for x in result["layers"]]
    top = client.get(f"/api/analyses/{job}/top-heads").json()["top_heads"]
    assert [h["name"] for h in top] == result["top_heads"]
    flow = client.get(f"/api/analyses/{job}/flow").json()["flow"]
    assert flow == [pytest.approx(x, rel=1e-5, abs=1e-7) for x in result["flow"]]
    assert len(flow) == result["n_layers"]


def test_a_figure_downloads_as_wide_as_the_page_drew_it(client: TestClient, job: str) -> None:
    def svg_width(url: str) -> float:
        svg = client.get(url)
        assert svg.status_code == 200, svg.text
        return float(ElementTree.fromstring(svg.content).attrib["width"])

    default = svg_width(f"/figures/{job}/layers.svg")
    narrow, wide = (
        svg_width(f"/figures/{job}/layers.svg?width=400"),
        svg_width(f"/figures/{job}/layers.svg?width=1200"),
    )
    assert narrow < default < wide and wide - narrow == pytest.approx(800, abs=2)
    for bad in ("12", "99999", "wide", "-5"):
        answer = client.get(f"/figures/{job}/layers.svg?width={bad}")
        assert answer.status_code == 422 and "width" in answer.text


def test_figure_downloads_in_four_formats(client: TestClient, job: str) -> None:
    result = client.get(f"/api/analyses/{job}").json()["result"]
    svg = client.get(f"/figures/{job}/heatmap.svg")
    assert svg.headers["content-type"] == "image/svg+xml"
    assert "attachment" in svg.headers["content-disposition"]
    assert len(marks(svg.content, "cells_marks")) == len(result["heads"])
    assert "hx-get" not in svg.text
    png = client.get(f"/figures/{job}/layers.png")
    assert png.content[:8] == b"\x89PNG\r\n\x1a\n"
    csv_lines = client.get(f"/figures/{job}/heatmap.csv").text.strip().splitlines()
    assert csv_lines[0] == (
        "layer,head,name,rank,increase,label_increase,other_increase,attn_true,attn_false"
    )
    assert len(csv_lines) == 1 + len(result["heads"])
    spec = client.get(f"/figures/{job}/layers.json").json()  # its Vega-Lite specification
    assert "vega-lite" in spec["$schema"]
    attn = [row["increase"] for row in figure_values(spec) if row["part"] == "attention"]
    assert attn == [pytest.approx(x["attn_increase"], rel=1e-5) for x in result["layers"]]
    flow = client.get(f"/figures/{job}/flow.svg").content
    assert len(marks(flow, "mark-line")) == 3  # one line per flow
    assert client.get(f"/figures/{job}/flow.png").content[:4] == b"\x89PNG"
    flow_csv = client.get(f"/figures/{job}/flow.csv").text.strip().splitlines()
    assert flow_csv[0].startswith("layer,demo_to_label,label_to_last,other,")
    name = result["top_heads"][0]
    for figure in ("attention", "scores", "increase", "margin"):
        response = client.get(f"/figures/{job}/heads/{name}/{figure}.csv")
        assert response.status_code == 200
        assert len(response.text.strip().splitlines()) == 1 + len(result["tokens"])


def test_compare_shows_difference_heatmap(client: TestClient, job: str) -> None:
    other = analyse(client, prompt="love : bar like : bar eight : foo one :", target="foo")
    page = soup(client.get(f"/compare?a={job}&b={other}").text)
    assert page.select_one(".compare-body[data-status=done]") is not None
    assert len(figure_values(figure_spec(page, "diff"))) == 12
    assert len(page.select(".compare-side")) == 2
    heads = client.get(f"/api/compare?a={job}&b={other}").json()["heads"]
    a = {
        h["name"]: h["increase"]
        for h in client.get(f"/api/analyses/{job}").json()["result"]["heads"]
    }
    b = {
        h["name"]: h["increase"]
        for h in client.get(f"/api/analyses/{other}").json()["result"]["heads"]
    }
    for row in heads:
        assert row["difference"] == pytest.approx(b[row["name"]] - a[row["name"]], abs=1e-6)
    assert client.get(f"/figures/compare/{job}/{other}/diff.csv").status_code == 200


FIGURE_LINK = re.compile(
    r"^/figures/(?:compare/a-\w+/a-\w+/(?P<compare>[\w-]+)|a-\w+/heads/L\d+H\d+/(?P<head>[\w-]+)"
    r"|a-\w+/(?P<analysis>[\w-]+))\.(?P<fmt>\w+)\?theme=light$"
)


def test_every_figure_link_in_the_pages_is_registered(client: TestClient, job: str) -> None:
    other = analyse(client, prompt="love : bar like : bar eight : foo one :", target="foo")
    name = client.get(f"/api/analyses/{job}").json()["result"]["top_heads"][0]
    pages = [
        client.get(f"/a/{job}").text,
        client.get(f"/a/{job}/status").text,
        client.get(f"/a/{job}/heads/{name}").text,
        client.get(f"/compare?a={job}&b={other}").text,
        client.get(f"/compare/panels/diff?a={job}&b={other}").text,
    ]
    links = {a["href"] for html in pages for a in soup(html).select("a[href^='/figures/']")}
    kinds = set()
    for link in links:
        match = FIGURE_LINK.match(link)
        assert match is not None, f"{link} is not a figure route"
        kind = next(k for k in ("analysis", "head", "compare") if match[k])
        entry = figure_entry(kind, match[kind])
        assert match["fmt"] in entry.formats, link
        assert client.get(link).status_code == 200, link
        kinds.add(kind)
    assert kinds == {"analysis", "head", "compare"}


def test_unknown_figures_are_404s_naming_the_known_ones(client: TestClient, job: str) -> None:
    unknown = client.get(f"/figures/{job}/attention.svg")
    assert unknown.status_code == 404
    assert "heatmap, layers, flow" in unknown.json()["detail"]
    name = client.get(f"/api/analyses/{job}").json()["result"]["top_heads"][0]
    head = client.get(f"/figures/{job}/heads/{name}/heatmap.png")
    assert head.status_code == 404 and "attention, scores" in head.json()["detail"]
    assert client.get(f"/figures/compare/{job}/{job}/layers.csv").status_code == 404


def test_bad_input_gets_clear_answers(client: TestClient, job: str) -> None:
    empty = client.post("/analyse", data={"prompt": ""}, follow_redirects=False)
    assert empty.status_code == 400
    assert soup(empty.text).select_one(".error") is not None
    missing = client.get("/a/a-00000000000000000000000000000000")
    assert missing.status_code == 404 and "unknown or expired" in missing.text
    assert client.get(f"/a/{job}/heads/L99H0").status_code == 404
    assert client.get(f"/a/{job}/heads/evil").status_code == 404
    assert client.get(f"/figures/{job}/heatmap.gif").status_code == 422
    assert (
        client.get(f"/api/compare?a={job}&b=a-00000000000000000000000000000000").status_code == 409
    )


def test_a_boosted_analyse_gets_whole_pages_and_a_partial_gets_a_fragment(
    client: TestClient, job: str
) -> None:
    """The Analyse form is sent by htmx in place of a page load (`HX-Boosted`): its answers,
    refusals included, are whole pages; an htmx request for a part gets a fragment."""
    boosted = {"HX-Request": "true", "HX-Boosted": "true"}
    form = soup(client.get("/").text).select_one("form.analyse-form")
    assert form is not None and form["hx-boost"] == "true"
    sent = client.post("/analyse", data={"prompt": EXAMPLE_PROMPT}, headers=boosted)
    assert sent.status_code == 200 and sent.url.path.startswith("/a/a-")
    assert soup(sent.text).select_one("header.topbar") is not None  # the whole page
    refused = client.post("/analyse", data={"prompt": EXAMPLE_PROMPT, "target": "x" * 201},
                          headers=boosted, follow_redirects=False)  # fmt: skip
    page = soup(refused.text)
    assert refused.status_code == 400 and page.select_one("form.analyse-form") is not None
    assert page.select_one("header.topbar") is not None and page.select_one(".error") is not None
    assert refused.headers["hx-push-url"] == "false"  # a reload could not GET /analyse
    assert "hx-push-url" not in sent.headers  # the permalink is pushed
    elsewhere = {"Origin": "http://evil.example"}  # refused before the route: error_response
    foreign = client.post("/analyse", data={"prompt": "a"}, headers=boosted | elsewhere)
    assert foreign.status_code == 403 and soup(foreign.text).select_one("header.topbar")
    assert foreign.headers["hx-push-url"] == "false"
    partial = client.post(
        "/analyse", data={"prompt": "a"}, headers={"HX-Request": "true"} | elsewhere
    )
    assert partial.status_code == 403 and partial.text.startswith('<div class="error-message"')


def test_long_polls_wait_for_each_stage(client: TestClient) -> None:
    """`?wait=` holds the status request until the job reaches its next stage: the per-head
    stage (the heatmap, data-status=heads) or the end; the heatmap's own poller
    (`after=heads`) then waits for the details; at most three polls see it done."""
    body = {"prompt": "two : foo love : bar like : bar one :"}  # not analysed before
    submitted = client.post("/api/analyses", json=body).json()
    job_id = submitted["id"]
    assert submitted["status"] in ("queued", "running")
    seen = []
    for _ in range(3):  # queued → running, running → per-head stage, → done
        after = "&after=heads" if seen and seen[-1] == "heads" else ""
        page = soup(client.get(f"/a/{job_id}/status?wait=30{after}").text)
        if after:
            assert page.select_one(".details-ready") is not None, page
            seen.append("done")
            break
        status = page.select_one("[data-status]")
        assert status is not None and status["data-status"] in ("running", "heads", "done")
        seen.append(status["data-status"])
        if seen[-1] == "done":
            break
    assert seen[-1] == "done"
    assert client.get(f"/a/{job_id}/status?wait=31").status_code == 422


def finished(client: TestClient, job_id: str) -> None:
    """Wait for a job released from `held_head_details` to end: between its per-head stage
    and its head details a busy machine may pause it long enough for the next test's hold
    to catch it."""
    status = wait_done(client, job_id).select_one("[data-status]")
    assert status is not None and status["data-status"] == "done"


#: The top-heads table's label / other cells.
SPLIT_CELLS = "table.top-heads td[data-col=label], table.top-heads td[data-col=other]"


def test_the_heatmap_comes_before_the_head_details(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the head details are computed, the page, the status poll and the API already
    hold the per-head stage; the head panel waits for the details; then everything is whole."""
    body = {"prompt": "six : foo hate : bar two : foo one :", "top_k_heads": 2}
    with held_head_details(monkeypatch):
        job_id = client.post("/api/analyses", json=body).json()["id"]
        for _ in range(3):  # queued → running → per-head stage: each wakes the long poll
            page = soup(client.get(f"/a/{job_id}/status?wait=30").text)
            heads = page.select_one(".analysis-body[data-status=heads]")
            if heads is not None:
                break
        assert heads is not None, page
        assert figure_values(figure_spec(page, "heatmap"))
        assert len(page.select("table.top-heads tbody tr")) == 2
        assert not [th for th in page.select("table.top-heads th") if "MRR" in th.text]
        split = page.select(
            "table.top-heads td[data-col=label], table.top-heads td[data-col=other]"
        )
        assert len(split) == 4 and {td.text for td in split} == {"…"}  # with the details
        poller = page.select_one(".details-pending")
        assert poller is not None
        assert poller["hx-get"] == f"/a/{job_id}/status?wait=10&after=heads"
        again = soup(client.get(poller["hx-get"].replace("wait=10", "wait=0")).text)
        assert again.select_one(".details-pending") is not None  # still pending: polls on
        assert soup(client.get(f"/a/{job_id}").text).select_one("[data-status=heads]")
        api = client.get(f"/api/analyses/{job_id}").json()
        assert api["status"] == "running" and api["result"]["head_details"] == {}
        assert {h["label_increase"] for h in api["result"]["heads"]} == {None}
        assert len(api["result"]["heads"]) == len(figure_values(figure_spec(page, "heatmap")))
        name = api["result"]["top_heads"][0]
        panel = client.get(f"/a/{job_id}/heads/{name}")
        assert panel.status_code == 200 and "on their way" in panel.text
        assert f"/a/{job_id}/heads/{name}?job={job_id}" in panel.text
        assert client.get(f"/api/analyses/{job_id}/top-heads").status_code == 409
        assert client.get(f"/api/analyses/{job_id}/heads/{name}").status_code == 202
    ready = soup(client.get(f"/a/{job_id}/status?wait=30&after=heads").text)
    refresh = ready.select_one(".details-ready")
    assert refresh is not None and refresh["hx-get"] == f"/a/{job_id}/status"
    assert refresh["hx-target"] == "closest .analysis-body"
    opened = {"HX-Current-URL": f"http://testserver/a/{job_id}?head={name}"}
    page = soup(client.get(refresh["hx-get"], headers=opened).text)
    assert page.select_one(".analysis-body[data-status=done]") is not None
    panel_loader = page.select_one("#head-panel")
    assert panel_loader is not None and panel_loader["hx-get"] == f"/a/{job_id}/heads/{name}"
    for bad in ("L99H0", "L0H0%22%3E", "x"):  # out of range or not a head: nothing opened
        opened = {"HX-Current-URL": f"http://testserver/a/{job_id}?head={bad}"}
        page = soup(client.get(refresh["hx-get"], headers=opened).text)
        assert not page.select_one("#head-panel").has_attr("hx-get")
    assert page.select_one(".details-pending") is None
    assert [th for th in page.select("table.top-heads th") if "MRR" in th.text]
    split = page.select(SPLIT_CELLS)
    assert len(split) == 4 and "…" not in {td.text for td in split}
    panel = client.get(f"/a/{job_id}/heads/{name}?job={job_id}")
    assert panel.status_code == 200 and "on their way" not in panel.text
    assert client.get(f"/api/analyses/{job_id}/heads/{name}").json()["status"] == "done"


def test_the_permalink_of_a_fresh_analysis_comes_with_its_heatmap(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Analyse → the permalink waits for the per-head stage instead of answering with a
    spinner whose poll fetches the heatmap in a second request."""
    from app.routes import pages

    monkeypatch.setattr(pages, "PAGE_WAIT_S", 30.0)  # however busy the machine
    with held_head_details(monkeypatch):
        form = {"prompt": "hate : bar six : foo two : foo love : bar one :"}
        location = client.post("/analyse", data=form, follow_redirects=False).headers["location"]
        page = soup(client.get(location).text)
        assert page.select_one(".analysis-body[data-status=heads]") is not None
        assert figure_values(figure_spec(page, "heatmap"))
        assert page.select_one(".details-pending") is not None
        assert page.select_one("[data-status=running]") is None
    finished(client, location.removeprefix("/a/"))


def test_a_spinner_polling_after_the_per_head_stage_gets_it_at_once(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spinner's long poll that starts once the per-head stage is there answers with the
    heatmap at once, not at the next change (the details, held here until the block ends)."""
    with held_head_details(monkeypatch):
        body = {"prompt": "two : foo love : bar hate : bar one :", "top_k_heads": 2}
        job_id = client.post("/api/analyses", json=body).json()["id"]
        deadline = time.monotonic() + 30
        while client.get(f"/api/analyses/{job_id}").json().get("result") is None:
            assert time.monotonic() < deadline, "the per-head stage never came"
            time.sleep(0.02)
        page = soup(client.get(f"/a/{job_id}/status?wait=30").text)
        assert page.select_one(".analysis-body[data-status=heads]") is not None, page
        pending = soup(client.get(f"/a/{job_id}/status?wait=0&after=heads").text)
        assert pending.select_one(".details-pending") is not None  # a shown stage: no news
    finished(client, job_id)


def test_failed_analysis_says_why(client: TestClient) -> None:
    body = {"prompt": EXAMPLE_PROMPT, "labels": ["zebra"]}
    job_id = client.post("/api/analyses", json=body).json()["id"]
    page = wait_done(client, job_id)
    failed = page.select_one("[data-status=failed]")
    assert failed is not None and "zebra" in failed.text
    assert "zebra" in soup(client.get(f"/a/{job_id}").text).select_one(".error").text


def test_token_strings_are_escaped(client: TestClient) -> None:
    job_id = analyse(client, prompt=XSS)
    html = client.get(f"/a/{job_id}").text
    assert "<script>alert" not in html and "<img src=x" not in html
    page = soup(html)
    assert [s.get("src") for s in page.select("script")] == [
        "/static/vendor/htmx-2.0.11.min.js",
        "/static/js/htmx-guard.js",
        "/static/js/figures.js",
        "/static/js/recent.js",
        "/static/js/preset-answer.js",
    ]
    assert [link.get("href") for link in page.select("link[data-vega]")] == [
        "/static/vendor/vega-6.2.0.min.js",  # run by figures.js after the first paint
        "/static/vendor/vega-lite-6.4.1.min.js",
        "/static/vendor/vega-embed-7.1.0.min.js",
    ]
    assert page.select("[onerror]") == []
    prompt = page.select_one("[data-prompt]")
    assert prompt is not None and prompt.text == XSS
    csp = client.get(f"/a/{job_id}").headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("script-src")[1]


def test_presentation_mode_by_query_and_cookie(client: TestClient, job: str) -> None:
    page = soup(client.get(f"/a/{job}?present=1&theme=dark").text)
    assert page.html is not None
    assert "present" in page.html["class"] and page.html["data-theme"] == "dark"
    response = client.get(f"/prefs?present=1&theme=light&next=/a/{job}", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == f"/a/{job}"
    client.cookies.update({"icl_present": "1", "icl_theme": "light"})
    try:
        page = soup(client.get(f"/a/{job}").text)
    finally:
        client.cookies.clear()
    assert page.html is not None and "present" in page.html["class"]
    assert page.html["data-theme"] == "light"
    outside = client.get("/prefs?present=0&next=//evil.example", follow_redirects=False)
    assert outside.headers["location"] == "/"


def test_static_assets_are_vendored(client: TestClient) -> None:
    htmx = client.get("/static/vendor/htmx-2.0.11.min.js")
    assert htmx.status_code == 200 and "htmx" in htmx.text[:200]
    assert client.get("/static/css/app.css").status_code == 200
    home = client.get("/").text
    assert not re.search(r"(src|href)=\"https?://", home)


PANEL_LINK = re.compile(r'^<([^>]+)>; rel="alternate"; type="application/json"$')


def alternate(response: Any) -> str:
    """The JSON twin a view's `Link` header names."""
    match = PANEL_LINK.match(response.headers.get("link", ""))
    assert match is not None, response.headers.get("link")
    return match[1]


def test_each_json_twin_names_its_model_in_openapi(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for slug, model in ANALYSIS_PANELS.items():
        answer = paths[f"/api/analyses/{{job_id}}/{slug}"]["get"]["responses"]["200"]
        schema = answer["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{model.__name__}"}, slug
    head = paths["/api/analyses/{job_id}/heads/{name}"]["get"]["responses"]
    named = {ref["$ref"] for ref in head["200"]["content"]["application/json"]["schema"]["anyOf"]}
    assert named == {
        f"#/components/schemas/{m.__name__}" for m in (HeadPanel, HeadPending, HeadOffer)
    }
    compare = paths["/api/compare"]["get"]["responses"]["200"]["content"]["application/json"]
    assert compare["schema"] == {"$ref": "#/components/schemas/Comparison"}
    pending = head["202"]["content"]["application/json"]["schema"]
    assert pending == {"$ref": f"#/components/schemas/{HeadPending.__name__}"}


def test_partial_and_twin_come_from_one_model(
    client: TestClient, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered = rendered_contexts(monkeypatch, panel_routes)
    client.app.state.page_cache = PageCache()  # type: ignore[attr-defined]  # (else served kept)
    for slug, model in ANALYSIS_PANELS.items():
        html = client.get(f"/a/{job}/panels/{slug}")
        assert html.status_code == 200
        panel = rendered.pop()["panel"]
        assert type(panel) is model
        twin = client.get(alternate(html))
        assert twin.status_code == 200
        assert twin.json() == panel.model_dump(mode="json"), slug
    tokens = client.get(f"/api/analyses/{job}/tokens").json()
    strip = BeautifulSoup(client.get(f"/a/{job}/panels/tokens").text, "html.parser")
    shown = [int(span["data-position"]) for span in strip.select(".tok[data-position]")]
    assert shown == [t["position"] for t in tokens["tokens"]]
    top = client.get(f"/api/analyses/{job}/top-heads").json()["top_heads"]
    table = BeautifulSoup(client.get(f"/a/{job}/panels/top-heads").text, "html.parser")
    assert [row["data-head-name"] for row in table.select("tr[data-head-name]")] == [
        h["name"] for h in top
    ]

    name = top[0]["name"]
    client.app.state.page_cache = PageCache()  # type: ignore[attr-defined]  # (else served kept)
    html = client.get(f"/a/{job}/heads/{name}")
    head = rendered.pop()["panel"]
    assert isinstance(head, HeadPanel)
    assert alternate(html) == f"/api/analyses/{job}/heads/{name}"
    assert client.get(alternate(html)).json() == head.model_dump(mode="json")


def test_compare_view_and_twin_come_from_one_model(
    client: TestClient, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison the page and the partial render is the object its twin answers with."""
    rendered = rendered_contexts(monkeypatch, page_routes)
    other = analyse(client, prompt="love : bar like : bar six : foo one :", target="foo")
    for view in (f"/compare?a={job}&b={other}", f"/compare/panels/diff?a={job}&b={other}"):
        html = client.get(view)
        comparison = rendered.pop()["comparison"]
        assert type(comparison) is Comparison
        assert (comparison.a, comparison.b) == (job, other)
        assert [side for side, _ in comparison.sides] == ["A", "B"]
        twin = client.get(alternate(html))
        assert twin.status_code == 200
        assert twin.json() == comparison.model_dump(mode="json")
        assert len(twin.json()["heads"]) == 12


def test_html_views_link_to_their_json_twin(client: TestClient, job: str) -> None:
    views = {
        f"/a/{job}": f"/api/analyses/{job}",
        f"/a/{job}/status": f"/api/analyses/{job}",
        f"/a/{job}/panels/heatmap": f"/api/analyses/{job}/heatmap",
        f"/a/{job}/panels/top-heads": f"/api/analyses/{job}/top-heads",
        f"/compare?a={job}&b={job}": f"/api/compare?a={job}&b={job}",
        f"/compare/panels/diff?a={job}&b={job}": f"/api/compare?a={job}&b={job}",
    }
    for view, twin in views.items():
        response = client.get(view)
        assert response.status_code == 200, view
        assert response.headers["content-type"].startswith("text/html")
        assert alternate(response) == twin, view
        answer = client.get(twin)
        assert answer.status_code == 200, twin
        assert answer.headers["content-type"] == "application/json"
