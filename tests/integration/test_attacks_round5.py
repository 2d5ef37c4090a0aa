"""Round five of the attacks on the lab server (issue 37), on the real app over the embedded
tiny-model backend: GETs compute nothing (5), ids are checked against what they claim (6),
numbers are ASCII digits (7), the diff panel refuses a non-analysis id (8). Each test fails on
the code before the fix."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.ascii_numbers import ascii_whole
from app.page_cache import PageCache
from model_worker.common.settings import Settings
from tests.app_clients import embedded_client
from tests.integration.test_pages import soup, wait_done
from tests.tiny_models import EXAMPLE_PROMPT

OTHER_PROMPT = "cat : foo dog : bar one : foo two : bar three :"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder = tmp_path_factory.mktemp("round5")  # its own store: no other module's results
    settings = Settings(model="tiny-llama", write_rate_limit_per_minute=0, data_dir=folder)
    with embedded_client(settings, raise_server_exceptions=False) as test_client:
        yield test_client


def analysed(client: TestClient, prompt: str, **options: object) -> str:
    job_id = str(client.post("/api/analyses", json={"prompt": prompt, **options}).json()["id"])
    wait_done(client, job_id)
    return job_id


@pytest.fixture(scope="module")
def narrow(client: TestClient) -> str:
    """A done analysis detailing only its top head (the tiny model has 8)."""
    return analysed(client, EXAMPLE_PROMPT, top_k_heads=1)


def undetailed(client: TestClient, job_id: str) -> str:
    result = client.get(f"/api/analyses/{job_id}").json()["result"]
    return next(h["name"] for h in result["heads"] if h["name"] not in result["head_details"])


def jobs_accepted(client: TestClient) -> int:
    backend = client.app.state.backend  # type: ignore[attr-defined]
    rows = backend._store._run("SELECT COUNT(*) FROM icl_jobs", fetch=True)
    return int(rows[0][0])


def until_done(client: TestClient, url: str) -> dict:
    """Poll a head's JSON twin (following its `job`) until the head is there."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        response = client.get(url)
        if response.status_code == 200:
            return dict(response.json())
        assert response.status_code == 202, response.text
        url = f"{url.split('?')[0]}?job={response.json()['job']}"
        time.sleep(0.05)
    raise AssertionError("the head did not arrive")


# --- 5: GETs compute nothing --------------------------------------------------------------


def test_a_get_of_a_head_outside_the_details_queues_nothing(
    client: TestClient, narrow: str
) -> None:
    name = undetailed(client, narrow)
    before = jobs_accepted(client)
    for url in (
        f"/api/analyses/{narrow}/heads/{name}",
        f"/api/analyses/{narrow}/heads/{name}?towers=true",
        f"/api/analyses/{narrow}/heads/{name}?keys=true",
        f"/a/{narrow}/heads/{name}",
        f"/a/{narrow}/heads/{name}?towers=true&position=3",
    ):
        answer = client.get(url)
        assert answer.status_code in (200, 409), (url, answer.status_code)
    assert jobs_accepted(client) == before
    api = client.get(f"/api/analyses/{narrow}/heads/{name}")
    assert api.status_code == 409 and api.json()["status"] == "not computed"
    offer = soup(client.get(f"/a/{narrow}/heads/{name}").text)
    button = offer.select_one('[data-action="compute-head"]')
    assert button is not None and button["hx-post"] == f"/a/{narrow}/heads/{name}"
    assert not offer.select("[hx-get]")


def test_a_get_for_a_stored_heads_decomposition_shows_the_head_and_offers_the_button(
    client: TestClient, narrow: str
) -> None:
    top = client.get(f"/api/analyses/{narrow}").json()["result"]["top_heads"][0]
    before = jobs_accepted(client)
    page = soup(client.get(f"/a/{narrow}/heads/{top}?towers=true").text)
    assert jobs_accepted(client) == before
    assert page.select_one(f".head[data-head-name={top}]") is not None  # what exists
    button = page.select_one('[data-action="compute-head"]')
    assert button is not None and button["hx-post"].endswith(f"/heads/{top}?towers=true")
    plain = soup(client.get(f"/a/{narrow}/heads/{top}").text)
    for action in ("towers", "label-keys"):
        found = plain.select_one(f'[data-action="{action}"]')
        assert found is not None and found.has_attr("hx-post") and not found.has_attr("hx-get")


def test_the_post_computes_it_and_the_get_then_finds_it(client: TestClient, narrow: str) -> None:
    name = undetailed(client, narrow)
    started = client.post(f"/api/analyses/{narrow}/heads/{name}?keys=true")
    assert started.status_code in (200, 202), started.text
    body = until_done(client, f"/api/analyses/{narrow}/heads/{name}?keys=true")
    assert body["detail"]["name"] == name and body["detail"]["keys"] is not None
    again = client.get(f"/api/analyses/{narrow}/heads/{name}?keys=true")  # found, not queued
    assert again.status_code == 200 and again.json()["job"] == body["job"]
    html = client.post(f"/a/{narrow}/heads/{name}?keys=true", headers={"HX-Request": "true"})
    assert html.status_code == 200 and f'data-head-name="{name}"' in html.text


def test_a_cross_site_post_for_a_head_is_refused(client: TestClient, narrow: str) -> None:
    name = undetailed(client, narrow)
    before = jobs_accepted(client)
    for headers in ({"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
        answer = client.post(f"/a/{narrow}/heads/{name}?towers=true", headers=headers)
        assert answer.status_code == 403
    assert jobs_accepted(client) == before


# --- 6: ids checked against what they claim ------------------------------------------------


def test_job_must_be_this_analysis_extra_run_for_this_head(client: TestClient, narrow: str) -> None:
    other = analysed(client, OTHER_PROMPT, top_k_heads=1)
    name = undetailed(client, narrow)
    for url in (
        f"/api/analyses/{narrow}/heads/{name}?job={other}",
        f"/a/{narrow}/heads/{name}?job={other}",
    ):
        answer = client.get(url)
        assert answer.status_code == 404, (url, answer.status_code, answer.text[:200])
        assert "not an extra analysis" in answer.text
    extra = client.post(f"/api/analyses/{narrow}/heads/{name}").json()["job"]
    second = next(h for h in ("L0H0", "L0H1", "L0H2", "L1H0") if h != name)
    assert client.get(f"/api/analyses/{narrow}/heads/{second}?job={extra}").status_code == 404
    assert client.get(f"/api/analyses/{other}/heads/{name}?job={extra}").status_code == 404
    assert until_done(client, f"/api/analyses/{narrow}/heads/{name}?job={extra}")["job"] == extra


# --- 7: digits are ASCII digits -------------------------------------------------------------


@pytest.mark.parametrize("digits", ["²", "١٢", "１２", "𝟙", "3²"])
def test_unicode_digits_are_a_422_never_a_500(client: TestClient, narrow: str, digits: str) -> None:
    top = client.get(f"/api/analyses/{narrow}").json()["result"]["top_heads"][0]
    for url in (
        f"/api/analyses/{narrow}/heads/{top}?towers=true&position={digits}",
        f"/api/analyses/{narrow}/heads/{top}?towers=true&versus={digits}",
        f"/figures/{narrow}/heatmap.svg?width={digits}",
        f"/figures/{narrow}/heads/{top}/attention.png?width={digits}",
    ):
        answer = client.get(url)
        assert answer.status_code == 422, (url, answer.status_code)


@pytest.mark.parametrize("typed", ["+3", "1_000", "３", "4.0"])
def test_numbers_typed_into_a_page_url_or_a_form_are_ascii_digits(
    client: TestClient, typed: str
) -> None:
    """The second attack: `/experiments?n=1_000` and `+3` in the experiment form's n or seed
    were taken (pydantic's own parsing of text), where the shared parser refuses them."""
    assert client.get("/experiments", params={"n": typed}).status_code == 422
    for field in ("n", "seed", "demos_per_label"):
        form = {"name": "accuracy", "dataset": "sentiment-number", "n": "4", field: typed}
        before = jobs_accepted(client)
        refused = client.post("/experiments", data=form)
        assert refused.status_code == 400 and "digits 0-9" in refused.text, (field, refused.text)
        assert jobs_accepted(client) == before
    assert client.get("/experiments", params={"n": "12"}).status_code == 200


def test_a_decomposition_outside_the_prompt_is_refused_at_submission(client: TestClient) -> None:
    """`towers_position` past the prompt was queued and failed in the job, with a traceback."""
    asked = {"prompt": EXAMPLE_PROMPT, "towers": ["L0H1"]}
    before = jobs_accepted(client)
    for position, said in ((10**30, "less than"), (5_000, "outside the prompt")):
        for field in ("towers_position", "towers_versus"):
            refused = client.post("/api/analyses", json=asked | {field: position})
            assert refused.status_code == 422 and said in refused.text, refused.text
    assert jobs_accepted(client) == before


@pytest.mark.parametrize(
    ("text", "value"),
    [("12", 12), (" 7 ", 7), ("0", 0), ("²", None), ("١", None), ("-1", None), ("1e3", None)]
    + [("", None), ("9" * 19, None), ("+4", None), ("4\n", None)],
)
def test_the_shared_parser_takes_ascii_digits_only(text: str, value: int | None) -> None:
    assert ascii_whole(text) == value


# --- 8: the diff panel refuses a non-analysis id ---------------------------------------------


def test_the_diff_panel_refuses_a_patching_id(client: TestClient, narrow: str) -> None:
    fast = {"top_k": 2, "qkv_heads": 1, "directions": ["denoising"], "labels": ["foo", "bar"]}
    patched = client.post("/api/patch", json={"prompt": EXAMPLE_PROMPT, **fast}).json()["id"]
    for _ in range(600):
        if client.get(f"/api/analyses/{patched}").json()["status"] == "done":
            break
        time.sleep(0.05)
    panel = client.get(f"/compare/panels/diff?a={narrow}&b={patched}")
    page = soup(panel.text)
    assert "not an analysis" in panel.text
    assert not page.select("[hx-get]")  # no poller: it polled "running" for ever


# --- 1: on-demand decompositions are priced whole -------------------------------------------


def test_a_decomposition_on_demand_is_priced_with_its_towers(
    client: TestClient, narrow: str
) -> None:
    """The extra analysis of a head with its score decomposed costs the analysis plus the
    decomposition: a budget that covers the plain extra analysis (n tokens × 2 detailed heads
    × 24) refuses the decomposed one (422 naming the knob); before, `towers` cost nothing."""
    n_tokens = len(client.get(f"/api/analyses/{narrow}").json()["result"]["tokens"])
    settings = Settings(
        model="tiny-llama",
        write_rate_limit_per_minute=0,
        max_analysis_cost=60 * n_tokens,
        data_dir=client.app.state.settings.data_dir / "priced",  # type: ignore[attr-defined]
    )
    with embedded_client(settings) as priced:
        job = analysed(priced, EXAMPLE_PROMPT, top_k_heads=1)
        name = undetailed(priced, job)
        plain = priced.post(f"/api/analyses/{job}/heads/{name}")
        assert plain.status_code in (200, 202), plain.text
        decomposed = priced.post(f"/api/analyses/{job}/heads/{name}?towers=true")
        assert decomposed.status_code == 422, decomposed.text
        assert "ICL_MAX_ANALYSIS_COST" in decomposed.text


# --- 2: pages priced like files -------------------------------------------------------------


def test_a_finished_page_is_built_once_off_the_event_loop(
    client: TestClient, narrow: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop on a permalink (or a head panel) rendered the page on the event loop every time;
    now it is built once, in a thread, and then served from memory (by URL and view
    preferences)."""
    import asyncio

    from app.routes import pages, panels

    def on_a_loop() -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    builds: list[bool] = []
    for module in (pages, panels):
        real = module.render

        def spy(*args: object, real: object = real, **kwargs: object) -> object:
            builds.append(on_a_loop())
            return real(*args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(module, "render", spy)
    client.app.state.page_cache = PageCache()  # type: ignore[attr-defined]  # none kept yet
    top = client.get(f"/api/analyses/{narrow}").json()["result"]["top_heads"][0]
    urls = [f"/a/{narrow}?head={top}", f"/a/{narrow}/heads/{top}", f"/a/{narrow}?theme=dark"]
    bodies = {url: {client.get(url).text for _ in range(3)} for url in urls}
    assert all(len(found) == 1 for found in bodies.values())  # the same page each time
    assert len(builds) == len(urls), builds  # built once per URL and preferences
    assert not any(builds)  # never on the event loop's thread
    dark, light = bodies[urls[2]].pop(), client.get(f"/a/{narrow}").text
    assert dark != light  # the theme is part of what a page is kept by


def test_a_finished_comparison_is_built_once_per_view(
    client: TestClient, narrow: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compare page (and its diff panel) rendered the comparison on the event loop each
    time; now, once both analyses are done, it is built once per view (ids, theme,
    presentation, htmx) in a thread and then served from memory."""
    import asyncio

    from app.routes import pages

    builds: list[bool] = []  # each render: whether on the event loop's thread
    real = pages.render

    def spy(*args: object, **kwargs: object) -> object:
        try:
            asyncio.get_running_loop()
            builds.append(True)
        except RuntimeError:
            builds.append(False)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pages, "render", spy)
    client.app.state.page_cache = PageCache()  # type: ignore[attr-defined]  # none kept yet
    other = analysed(client, OTHER_PROMPT, top_k_heads=1)
    page, panel = f"/compare?a={narrow}&b={other}", f"/compare/panels/diff?a={narrow}&b={other}"
    first = client.get(page)
    assert first.status_code == 200 and "compare" in first.text.lower()
    assert all(client.get(page).text == first.text for _ in range(3))
    assert len(builds) == 1  # a second identical request does not render again
    dark = client.get(f"{page}&theme=dark")
    assert dark.status_code == 200 and dark.text != first.text
    assert len(builds) == 2  # another view is another entry
    htmx = {"HX-Request": "true"}
    assert client.get(panel, headers=htmx).text == client.get(panel, headers=htmx).text
    assert client.get(panel).status_code == 200
    assert len(builds) == 4  # the panel: one build per view (htmx or not)
    assert not any(builds)  # never on the event loop's thread
    swapped = client.get(f"/compare?a={other}&b={narrow}")  # B − A the other way: its own page
    assert swapped.status_code == 200 and len(builds) == 5


def test_made_up_parameters_neither_miss_the_cache_nor_end_up_in_a_kept_page(
    client: TestClient, narrow: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page was kept by its whole query: a loop adding `&n=1`, `&n=2`, … built every page
    anew (within every limit), and the first such URL was echoed into the kept page's links.
    Now a parameter the page does not read sends the client to the URL without it, and the
    page is built once."""
    from app.routes import pages, panels

    other = analysed(client, OTHER_PROMPT, top_k_heads=1)
    top = client.get(f"/api/analyses/{narrow}").json()["result"]["top_heads"][0]
    builds: list[object] = []  # the templates rendered
    for module in (pages, panels):
        real = module.render

        def spy(*args: object, real: object = real, **kwargs: object) -> object:
            builds.append(args[1])
            return real(*args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(module, "render", spy)
    client.app.state.page_cache = PageCache()  # type: ignore[attr-defined]  # none kept yet
    canonical = [
        f"/a/{narrow}?head={top}&theme=dark",
        f"/a/{narrow}/heads/{top}",
        f"/compare?a={narrow}&b={other}",
        f"/compare/panels/diff?a={narrow}&b={other}",
    ]
    for url in canonical:
        joined = "&" if "?" in url else "?"
        for n in range(3):
            moved = client.get(f"{url}{joined}n={n}%22", follow_redirects=False)
            assert moved.status_code == 303, (url, moved.status_code)
            assert moved.headers["location"] == url
        assert "%22" not in client.get(url).text and "n=0" not in client.get(url).text
    assert len(builds) == len(canonical)  # each page built once, for its own URL


def test_every_finished_page_and_poll_answer_is_kept_and_built_off_the_loop(
    client: TestClient, narrow: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second attack found one more page rendered on the event loop each time: the
    status poll of a done analysis (the whole body, ~40 ms on a long prompt; 16 loops took a
    colleague's `/healthz` ×118). It, the analysis' own panels, the patching pages and panels,
    and the experiment page and its poll are now kept once done, and built in a thread."""
    import asyncio

    from app.routes import atlas, experiments, panels, patching

    fast = {"top_k": 2, "qkv_heads": 1, "directions": ["denoising"], "labels": ["foo", "bar"]}
    patched = client.post("/api/patch", json={"prompt": EXAMPLE_PROMPT, **fast}).json()["id"]
    experiment = {"name": "accuracy", "dataset": "sentiment-number", "n": 4}
    run = client.post("/api/experiments", json=experiment).json()["id"]
    for job in (patched, run):
        for _ in range(1200):
            if client.get(f"/api/analyses/{job}").json()["status"] == "done":
                break
            time.sleep(0.05)
    builds: list[bool] = []  # each render: whether on the event loop's thread
    for module in (panels, patching, experiments, atlas):
        real = module.render

        def spy(*args: object, real: object = real, **kwargs: object) -> object:
            try:
                asyncio.get_running_loop()
                builds.append(True)
            except RuntimeError:
                builds.append(False)
            return real(*args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(module, "render", spy)
    client.app.state.page_cache = PageCache()  # type: ignore[attr-defined]  # none kept yet
    top = client.get(f"/api/analyses/{narrow}").json()["result"]["top_heads"][0]
    opened = {"HX-Request": "true", "HX-Current-URL": f"http://testserver/a/{narrow}?head={top}"}
    asks = [
        (f"/a/{narrow}/status", {"HX-Request": "true"}),
        (f"/a/{narrow}/status?wait=1", opened),  # the open head is what the body keeps open
        (f"/a/{narrow}/panels/heatmap", {"HX-Request": "true"}),
        (f"/a/{narrow}/panels/top-heads", {"HX-Request": "true"}),
        (f"/p/{patched}", {}),
        (f"/p/{patched}/status", {"HX-Request": "true"}),
        (f"/p/{patched}/denoising/heads/{top}", {"HX-Request": "true"}),
        (f"/e/{run}", {}),
        (f"/e/{run}/status", {"HX-Request": "true"}),
    ]
    for url, headers in asks:
        answers = [client.get(url, headers=headers) for _ in range(3)]
        assert all(a.status_code == 200 for a in answers), (url, answers[0].text[:200])
        assert len({a.text for a in answers}) == 1, url
    assert len(builds) == len(asks), builds  # each built once
    assert not any(builds)  # none on the event loop's thread
    kept_open = client.get(f"/a/{narrow}/status", headers=opened).text
    assert kept_open != client.get(f"/a/{narrow}/status", headers={"HX-Request": "true"}).text
