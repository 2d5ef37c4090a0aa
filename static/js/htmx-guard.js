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
    }
  });
})();
