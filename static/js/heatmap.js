// Heatmap cells open their head's panel: a click, or Enter / Space on a focused cell.
// One delegated listener for the page instead of an htmx binding on each of the L×H cells,
// which kept the first paint of a cached analysis page waiting for htmx to process them all.
(function () {
  "use strict";

  function openHead(cell) {
    var root = cell.closest("[data-heads-url]");
    if (!root || !window.htmx) return;
    var name = "L" + cell.getAttribute("data-layer") + "H" + cell.getAttribute("data-head");
    var base = root.getAttribute("data-heads-url");
    window.htmx.ajax("GET", base + "/heads/" + name, {
      target: "#head-panel",
      swap: "innerHTML",
      push: base + "?head=" + name,
    });
  }

  function cellOf(event) {
    var target = event.target;
    return target && target.closest ? target.closest("[data-heads-url] rect.cell") : null;
  }

  // A head opened while the finished analysis' body was on its way (its request carried the
  // URL from before the click) is opened again in the body that replaced it: once per panel.
  function keepOpenHead() {
    var match = /[?&]head=(L\d+H\d+)/.exec(window.location.search);
    var panel = document.getElementById("head-panel");
    var root = document.querySelector("[data-heads-url]");
    if (!match || !panel || !root || !window.htmx) return;
    if (panel.querySelector(":scope > :not(.hint)") || panel.hasAttribute("hx-get")) return;
    if (panel.getAttribute("data-reopened") === match[1]) return;
    panel.setAttribute("data-reopened", match[1]);
    window.htmx.ajax("GET", root.getAttribute("data-heads-url") + "/heads/" + match[1], {
      target: "#head-panel",
      swap: "innerHTML",
    });
  }

  document.addEventListener("htmx:afterSettle", keepOpenHead);
  document.addEventListener("click", function (event) {
    var cell = cellOf(event);
    if (cell) openHead(cell);
  });
  document.addEventListener("keydown", function (event) {
    var cell = cellOf(event);
    if (cell && (event.key === "Enter" || event.key === " ")) {
      event.preventDefault();
      openHead(cell);
    }
  });
})();
