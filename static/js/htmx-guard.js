// htmx swaps an answer into the page as HTML: only ever swap HTML fragments from this server.
// Any other answer (JSON, SVG …) is dropped, so no request, however its URL was built, can put
// text from elsewhere into the page as markup. The server refuses the same (app/security/htmx.py).
(function () {
  "use strict";
  document.addEventListener("htmx:beforeSwap", function (event) {
    var xhr = event.detail.xhr;
    var type = (xhr && xhr.getResponseHeader("Content-Type")) || "";
    if (type.indexOf("text/html") !== 0) {
      event.detail.shouldSwap = false;
    } else if (event.detail.boosted && xhr.status >= 400) {
      // A boosted form (Analyse) stands for a page load: the server answers a refused one with
      // the whole page and its reason (the form again, an error page), shown as a browser would.
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });

  // A boosted form whose request never got an answer (the connection failed) is sent again as
  // an ordinary form: the browser then loads the answer, or shows why it cannot.
  document.addEventListener("htmx:sendError", function (event) {
    var form = event.detail.elt;
    if (event.detail.boosted && form && form.tagName === "FORM") {
      form.submit();
    }
  });

  // htmx keeps each page's markup for the Back button: write what was typed into the form
  // controls' markup first, so that going back to the form finds the prompt as it was left.
  document.addEventListener("htmx:beforeHistorySave", function () {
    document.querySelectorAll("textarea").forEach(function (box) {
      box.textContent = box.value;
    });
    document.querySelectorAll("input:not([type=password]):not([type=hidden])").forEach(function (input) {
      if (input.type === "checkbox" || input.type === "radio") {
        input.toggleAttribute("checked", input.checked);
      } else {
        input.setAttribute("value", input.value);
      }
    });
    document.querySelectorAll("select option").forEach(function (option) {
      option.toggleAttribute("selected", option.selected);
    });
  });
})();
