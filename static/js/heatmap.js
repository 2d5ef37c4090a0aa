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
