// A preset's expected answer belongs to the preset's prompt: once the prompt is edited away
// from it, "Expected" empties (else a prompt of one's own would be judged against the preset's
// answer); editing back restores it. An answer the user typed is never touched.
(function () {
  "use strict";
  document.addEventListener("input", function (event) {
    var prompt = event.target;
    if (!prompt || !prompt.matches || !prompt.matches("textarea[name=prompt]") || !prompt.form) {
      return;
    }
    var expected = prompt.form.querySelector("input[name=expected][data-for-prompt]");
    if (!expected) return;
    var answer = expected.getAttribute("data-preset-answer") || "";
    if (expected.value !== "" && expected.value !== answer) return; // the user's own answer
    var same = prompt.value.trim() === (expected.getAttribute("data-for-prompt") || "").trim();
    expected.value = same ? answer : "";
  });
})();
