"""The patching page in a real browser: from an analysis, "patch against…" the labels-swapped
corruption; the patching-effect and direct-effect heatmaps draw; clicking a head opens its
per-position view; a head without one is patched per position on request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.tiny_models import EXAMPLE_PROMPT

pytestmark = pytest.mark.browser
CELLS = 12  # the tiny llama: 3 layers × 4 heads


def test_patch_against_then_open_a_heads_per_position_view(
    page: Page, base_url: str, artifacts: Path
) -> None:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("response", lambda r: errors.append(r.url) if r.status >= 400 else None)
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(base_url + "/")
    page.fill("textarea[name=prompt]", EXAMPLE_PROMPT)
    page.fill("input[name=labels]", "foo, bar")
    page.click("#analyse")
    expect(page.locator("[data-figure=heatmap] .cell")).to_have_count(CELLS, timeout=30_000)
    form = page.locator("form[data-patch-against]")
    expect(form).to_be_visible(timeout=30_000)
    form.locator("select[name=corruption]").select_option("swap-labels")
    form.locator("button[type=submit]").click()

    effects = page.locator(".vl-figure[data-figure=effects]")
    expect(effects.locator(".cell")).to_have_count(CELLS, timeout=60_000)
    expect(page.locator(".vl-figure[data-figure=direct] .cell")).to_have_count(CELLS)
    assert "/p/p-" in page.url
    spec = json.loads(effects.get_attribute("data-spec") or "{}")
    outlined = [c["name"] for c in spec["data"]["values"] if c["top"]]
    assert len(outlined) == 12  # top_k 20 > 12 heads: every head patched exactly
    for name in ("agreement", "sites", "qkv"):
        expect(page.locator(f".vl-figure[data-figure={name}]")).to_have_attribute(
            "data-drawn", "true", timeout=30_000
        )
    expect(page.locator("table.patch-qkv tbody tr")).to_have_count(9)  # 3 heads × q, k, v
    page.screenshot(path=artifacts / "patching.png", full_page=True)

    job_id = page.url.split("/p/")[1].split("?")[0].split("/")[0]
    result = page.request.get(f"{base_url}/api/analyses/{job_id}").json()["patching"]
    name = result["in_context_heads"][0]
    layer, head = name[1:].split("H")
    effects.locator(f".cell[data-layer='{layer}'][data-head='{head}']").click()
    panel = page.locator(f"#head-panel .patch-head[data-head={name}]")
    expect(panel).to_be_visible(timeout=30_000)
    assert page.url.endswith(f"?head={name}")
    positions = panel.locator(".vl-figure[data-figure=positions]")
    expect(positions).to_have_attribute("data-drawn", "true", timeout=30_000)
    rows = json.loads(positions.get_attribute("data-spec") or "{}")["data"]["values"]
    assert len(rows) == 2 * len(result["tokens"])  # exact and attribution at every position
    expect(positions.locator("g.mark-rect path")).to_have_count(2 * len(result["tokens"]))
    panel.scroll_into_view_if_needed()
    page.screenshot(path=artifacts / "patching-head.png", full_page=False)

    other = next(h for h in result["directions"][0]["heads"] if h["name"] != name)["name"]
    layer, head = other[1:].split("H")
    page.locator(
        f".vl-figure[data-figure=direct] .cell[data-layer='{layer}'][data-head='{head}']"
    ).click()
    panel = page.locator(f"#head-panel .patch-head[data-head={other}]")
    expect(panel.locator("[data-no-positions]")).to_be_visible(timeout=30_000)
    # patched exactly (every head is, on this model): its per-position attribution estimates
    estimates = panel.locator(".vl-figure[data-figure=positions]")
    expect(estimates).to_have_attribute("data-drawn", "true", timeout=30_000)
    series = {
        r["series"]
        for r in json.loads(estimates.get_attribute("data-spec") or "{}")["data"]["values"]
    }
    assert series == {"attribution"}
    panel.locator("button[type=submit]").click()  # a new job with that head per position
    page.wait_for_url(lambda url: job_id not in url, timeout=60_000)
    positions = page.locator(
        f"#head-panel .patch-head[data-head={other}] .vl-figure[data-figure=positions]"
    )
    expect(positions).to_have_attribute("data-drawn", "true", timeout=60_000)
    rows = json.loads(positions.get_attribute("data-spec") or "{}")["data"]["values"]
    assert {r["series"] for r in rows} == {"exact", "attribution"}
    new_id = page.url.split("/p/")[1].split("/")[0]
    again = page.request.get(f"{base_url}/api/analyses/{new_id}").json()["patching"]
    computed = {p["name"] for p in again["directions"][0]["positions"]}
    assert computed == {name, other}  # the first head's per-position view is kept
    assert errors == []
