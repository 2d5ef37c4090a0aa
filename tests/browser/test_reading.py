"""What a page shows reads as what it is (issue 39), in Chromium: an Arabic and an emoji
prompt's byte-level pieces show as their characters, numbered, in the token strip and on the
attention chart's axis; a prompt without labels leaves out what needs them (the label / other
and attention columns, the label flow, label-swapping patching) and its warning says so; digit
labels, read at their distinguishing token by the analysis, patch."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from playwright.sync_api import Page, expect
from transformers import GPT2Config, GPT2LMHeadModel

from app.main import create_app
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from model_worker.model.loading import LoadedModel, wrap_model
from tests.browser.live import serve
from tests.unit.test_label_reading import DIGITS, spaced_model
from tests.unit.test_token_text import byte_level

pytestmark = pytest.mark.browser
#: "رائع : 1 😀 : 0 سيء :" as a byte-level BPE without merges splits it: a token per byte
PIECES = "رائع : 1 😀 : 0 سيء :"
NO_LABELS = "love hate like good bad love hate like"


def tiny_bytes() -> LoadedModel:
    """A tiny random GPT-2 over a byte-level vocabulary (every byte a token)."""
    tokenizer = byte_level()
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=16, n_layer=2, n_head=2)
    return wrap_model(GPT2LMHeadModel(config), tokenizer, name="tiny-bytes")


def live(tmp: Path, name: str, loader: object) -> Iterator[str]:
    settings = Settings(model=name, data_dir=tmp)
    app = create_app(settings, embedded_backend(settings, loader=loader))  # type: ignore[arg-type]
    with serve(app) as url:
        yield url


@pytest.fixture(scope="module")
def bytes_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from live(tmp_path_factory.mktemp("bytes"), "tiny-bytes", tiny_bytes)


@pytest.fixture(scope="module")
def spaced_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from live(tmp_path_factory.mktemp("spaced"), "tiny-spaced", spaced_model)


def analyse(page: Page, url: str, prompt: str, target: str = "") -> None:
    page.goto(url + "/")
    page.fill("textarea[name=prompt]", prompt)
    page.fill('input[name="target"]', target)
    page.click("#analyse")
    expect(page.locator(".analysis-body[data-status=done]")).to_be_visible(timeout=60_000)


def test_arabic_and_emoji_pieces_read_as_their_characters(
    page: Page, bytes_url: str, artifacts: Path
) -> None:
    page.set_viewport_size({"width": 1440, "height": 900})
    analyse(page, bytes_url, PIECES)
    strip = page.locator(".token-strip .tok")
    texts = strip.all_inner_texts()
    assert not any("\\x" in t for t in texts), texts
    for piece in ("ر₁", "ر₂", "😀₁", "😀₄", "س₂"):
        assert piece in texts, (piece, texts)
    assert re.search(
        r"token \\x[0-9a-f]{2}", strip.nth(texts.index("😀₁")).get_attribute("title") or ""
    )
    page.locator("table.top-heads a.head-link").first.click()
    attention = page.locator("#head-panel .vl-figure[data-figure=attention][data-drawn=true]")
    expect(attention).to_be_visible(timeout=30_000)
    labels = attention.locator("g.role-axis-label text").evaluate_all(
        "els => els.map(e => e.textContent)"
    )
    assert "😀₂" in labels and not any("\\x" in t for t in labels), labels
    page.screenshot(path=artifacts / "reading-pieces.png", full_page=True)


def test_a_prompt_without_labels_leaves_out_what_needs_them(
    page: Page, spaced_url: str, artifacts: Path
) -> None:
    page.set_viewport_size({"width": 1280, "height": 720})
    analyse(page, spaced_url, NO_LABELS)
    warning = page.locator("[data-warning=no_icl_shape]")
    expect(warning).to_contain_text("left out")
    expect(warning).not_to_contain_text("empty")
    header = page.locator("table.top-heads thead").inner_text()
    assert "attn" not in header and "label" not in header and "increase" in header
    expect(page.locator(".panel-flow")).to_have_count(0)
    options = page.locator("form[data-patch-against] select[name=corruption] option")
    assert options.evaluate_all("o => o.map(x => x.value)") == ["analysis"]
    page.screenshot(path=artifacts / "reading-no-labels.png", full_page=True)


def test_digit_labels_patch_as_they_are_analysed(
    page: Page, spaced_url: str, artifacts: Path
) -> None:
    """Patching reads the prompt as the analysis does (issue 36.3's one reading): digit labels
    that share SmolLM2-style " " are patched at the digit (before, patching refused them: "the
    labels '1' and '0' start with the same token")."""
    page.set_viewport_size({"width": 1440, "height": 900})
    analyse(page, spaced_url, DIGITS, target="1")
    assert page.locator(".token-strip .tok--true").all_inner_texts() == ["1", "1"]
    form = page.locator("form[data-patch-against]")
    form.locator("select[name=corruption]").select_option("swap-labels")
    form.locator("button[type=submit]").click()
    expect(page.locator(".vl-figure[data-figure=effects][data-drawn=true]")).to_be_visible(
        timeout=60_000
    )
    assert "/p/p-" in page.url
    expect(page.locator("body")).not_to_contain_text("start with the same token")
    page.screenshot(path=artifacts / "reading-digit-patching.png", full_page=True)
