"""A preset's expected answer is not carried over to a prompt of one's own: typing another
prompt over the preset empties "Expected", so the analysis is not judged against it."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

pytestmark = pytest.mark.browser

OWN_PROMPT = "like : bar love : bar two : foo eight : foo one :"  # the tiny vocabulary


def test_editing_the_presets_prompt_empties_its_expected_answer(page: Page, base_url: str) -> None:
    page.goto(base_url + "/")
    expected = page.locator("input[name=expected]")
    preset_answer = expected.input_value()
    assert preset_answer  # the first preset's answer is filled in
    prompt = page.locator("textarea[name=prompt]")
    preset_prompt = prompt.input_value()
    prompt.fill(OWN_PROMPT)
    expect(expected).to_have_value("")
    prompt.fill(preset_prompt)
    expect(expected).to_have_value(preset_answer)
    expected.fill("bar")  # an answer of one's own stays whatever the prompt
    prompt.fill(OWN_PROMPT + " ")
    expect(expected).to_have_value("bar")
    expected.fill("")
    prompt.fill(OWN_PROMPT)
    page.click("#analyse")
    page.wait_for_url("**/a/a-*", timeout=30_000)
    answer_line = page.locator(".analysis-body[data-status=done]")
    expect(answer_line).to_be_visible(timeout=60_000)
    assert "expected answer given" not in page.content()
