// Figures: every `.vl-figure[data-vl]` holds its Vega-Lite specification (`data-spec`, in the
// page's theme); vega-embed draws it as SVG with tooltips. CSP-safe: Vega's expression
// interpreter (`ast: true`, no eval) and no injected <style> (the tooltip and embed styles are
// in app.css). The heatmap's cells open their head's panel: a click, or Tab to the heatmap (one
// Tab stop), arrow keys to a cell and Enter / Space (its cells get a role and a label once
// drawn). An opened head's panel scrolls into view and takes the focus; Back returns.
(function () {
  "use strict";

  function options(host) {
    var dark = /dark/.test(host.getAttribute("data-theme") || "");
    return {
      renderer: "svg",
      actions: false,
      ast: true,
      defaultStyle: false,
      tooltip: { theme: dark ? "dark" : "light", disableDefaultStyle: true },
    };
  }

  // --- the heatmap: which head a cell is, and opening its panel ---

  // the figures whose marks open a head's panel: the analysis page's heatmap, the patching
  // page's patching-effect and direct-effect heatmaps (app/views/figures/patching.py), and the
  // atlas's scatter matrix (its points: app/views/figures/atlas.py)
  var CLICKABLE = ["heatmap", "effects", "direct", "matrix"];
  var HEAD_MARKS = ["cells_marks", "points_marks"];

  var asked = null; // the head a click or Enter asked for last (see keepOpenHead)

  function cellItems(view) {
    var found = [];
    (function walk(node) {
      if (!node) return;
      if (node.marktype && node.name === "cells_marks") {
        found = found.concat(node.items || []);
        return;
      }
      (node.items || []).forEach(walk);
    })(view.scenegraph().root);
    return found;
  }

  // what a cell announces: its head, layer, head index and value
  function cellLabel(d) {
    var value = d.increase_text
      ? "increase " + d.increase_text
      : typeof d.value === "number"
        ? "value " + d.value.toFixed(3)
        : "";
    return d.name + ": layer " + d.layer + ", head " + d.head + (value ? ", " + value : "");
  }

  // One Tab stop per heatmap (roving focus): the cell Tab lands on is the one last moved to
  // (the host's data-rove), else the first; arrow keys move between cells (see rove).
  function labelCells(host, view) {
    var current = host.getAttribute("data-rove");
    var items = cellItems(view);
    var found = false;
    items.forEach(function (item) {
      var el = item._svg;
      var d = item.datum;
      if (!el || !d) return;
      var here = d.layer + "," + d.head === current;
      found = found || here;
      el.setAttribute("class", "cell");
      el.setAttribute("tabindex", here ? "0" : "-1");
      el.setAttribute("role", "button");
      el.setAttribute("data-layer", String(d.layer));
      el.setAttribute("data-head", String(d.head));
      el.setAttribute("aria-label", cellLabel(d));
    });
    if (!found && items.length && items[0]._svg) items[0]._svg.setAttribute("tabindex", "0");
  }

  // --- keyboard: arrows move the heatmap's focus (layers left / right, heads up / down; Home /
  // End: the row's first / last layer; PageUp / PageDown: the column's first / last head) ---
  var MOVES = {
    ArrowRight: [1, 0],
    ArrowLeft: [-1, 0],
    ArrowDown: [0, 1],
    ArrowUp: [0, -1],
  };

  function cellAt(grid, layer, head) {
    return grid.querySelector('.cell[data-layer="' + layer + '"][data-head="' + head + '"]');
  }

  function rove(cell, key) {
    var grid = cell.closest("svg.vl-preview") || cell.closest(".vl-figure");
    var layer = Number(cell.getAttribute("data-layer"));
    var head = Number(cell.getAttribute("data-head"));
    var cells = grid.querySelectorAll(".cell");
    var last = cells.length ? cells[cells.length - 1] : cell;
    var to = null;
    if (MOVES[key]) {
      to = cellAt(grid, layer + MOVES[key][0], head + MOVES[key][1]);
    } else if (key === "Home" || key === "End") {
      to = cellAt(grid, key === "Home" ? 0 : Number(last.getAttribute("data-layer")), head);
    } else if (key === "PageUp" || key === "PageDown") {
      to = cellAt(grid, layer, key === "PageUp" ? 0 : Number(last.getAttribute("data-head")));
    }
    if (!to) return;
    cell.setAttribute("tabindex", "-1");
    to.setAttribute("tabindex", "0");
    var host = cell.closest(".vl-figure");
    if (host) host.setAttribute("data-rove", to.getAttribute("data-layer") + "," + to.getAttribute("data-head"));
    to.focus();
  }

  function openHead(root, name) {
    if (!root || !window.htmx) return;
    var base = root.getAttribute("data-heads-url");
    var panel = document.getElementById("head-panel");
    // the panel this request fills; a body swapped in before its answer has a new one
    if (panel) panel.setAttribute("data-opening", name);
    asked = name;
    window.htmx.ajax("GET", base + "/heads/" + name, {
      target: "#head-panel",
      swap: "innerHTML",
      push: base + "?head=" + name,
    });
  }

  function wireHeatmap(host, view) {
    var root = host.closest("[data-heads-url]");
    if (!root) return;
    view.addEventListener("click", function (_event, item) {
      if (item && item.mark && HEAD_MARKS.indexOf(item.mark.name) >= 0 && item.datum && item.datum.name) {
        openHead(root, item.datum.name);
      }
    });
    labelCells(host, view);
    if (host.hasAttribute("data-refocus")) {
      host.removeAttribute("data-refocus");
      var cell = host.querySelector('.cell[tabindex="0"]');
      if (cell) cell.focus({ preventScroll: true });
    }
    view.addResizeListener(function () {
      view.runAsync().then(function () {
        labelCells(host, view);
      });
    });
  }

  // the server's first paint of the heatmap (before Vega has drawn it) opens heads too
  document.addEventListener("click", function (event) {
    var cell = event.target && event.target.closest ? event.target.closest(".vl-preview .cell") : null;
    if (!cell) return;
    var name = "L" + cell.getAttribute("data-layer") + "H" + cell.getAttribute("data-head");
    openHead(cell.closest("[data-heads-url]"), name);
  });

  document.addEventListener("keydown", function (event) {
    var cell = event.target && event.target.closest ? event.target.closest(".vl-figure .cell") : null;
    if (!cell || event.altKey || event.ctrlKey || event.metaKey) return;
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      var name = "L" + cell.getAttribute("data-layer") + "H" + cell.getAttribute("data-head");
      opener = { grid: cell.closest(".vl-figure").getAttribute("data-figure"), name: name };
      openHead(cell.closest("[data-heads-url]"), name);
    } else if (MOVES[event.key] || /^(Home|End|PageUp|PageDown)$/.test(event.key)) {
      event.preventDefault();
      rove(cell, event.key);
    }
  });

  // --- a long table of heads (the atlas's: [data-rove-rows]) is one Tab stop too: its head
  // links take the focus in turn with the arrow keys (Home / End: the first / last row) ---

  function roveRows(root) {
    (root || document).querySelectorAll("[data-rove-rows]").forEach(function (table) {
      var links = table.querySelectorAll("tbody a.head-link");
      if (!links.length || table.querySelector('tbody a.head-link[tabindex="0"]')) return;
      links.forEach(function (a, i) {
        a.setAttribute("tabindex", i === 0 ? "0" : "-1");
      });
    });
  }

  document.addEventListener("keydown", function (event) {
    var link = event.target && event.target.closest ? event.target.closest("[data-rove-rows] tbody a.head-link") : null;
    if (!link || event.altKey || event.ctrlKey || event.metaKey) return;
    var links = Array.prototype.slice.call(link.closest("tbody").querySelectorAll("a.head-link"));
    var at = links.indexOf(link);
    var to = { ArrowDown: at + 1, ArrowUp: at - 1, Home: 0, End: links.length - 1 }[event.key];
    if (to === undefined) return;
    event.preventDefault();
    if (to < 0 || to >= links.length) return;
    link.setAttribute("tabindex", "-1");
    links[to].setAttribute("tabindex", "0");
    links[to].focus();
  });
  document.addEventListener("htmx:afterSettle", function () {
    roveRows(document);
  });

  // --- an opened head's panel comes into view with the focus on its heading; Back (htmx
  // restores the scroll position) gives the focus back to the cell or link that opened it ---

  var opener = null; // what opened the panel last: {grid: figure name, name} or {link: name}
  var showPanel = false; // a head's panel was asked for and its heading has not arrived yet

  document.addEventListener("htmx:beforeRequest", function (event) {
    var target = event.detail && event.detail.target;
    if (target && target.id === "head-panel") showPanel = true;
    var link = event.detail && event.detail.elt;
    if (link && link.classList && link.classList.contains("head-link")) {
      opener = { link: link.textContent.trim() };
    }
  });

  function bringPanel() {
    var panel = document.getElementById("head-panel");
    if (!showPanel || !panel) return;
    var heading = panel.querySelector("h2, [role=alert]");
    if (panel.getBoundingClientRect().top < 0 || panel.getBoundingClientRect().top > window.innerHeight * 0.5) {
      panel.scrollIntoView({ block: "start" });
    }
    if (!heading) return; // still computing: the heading takes the focus when it comes
    showPanel = false;
    heading.setAttribute("tabindex", "-1");
    heading.focus({ preventScroll: true });
  }
  document.addEventListener("htmx:afterSettle", bringPanel);

  function refocusOpener() {
    var was = opener;
    showPanel = false;
    if (!was) return;
    var el = null;
    if (was.link) {
      document.querySelectorAll("a.head-link").forEach(function (a) {
        if (!el && a.textContent.trim() === was.link) el = a;
      });
    } else {
      var found = /^L(\d+)H(\d+)$/.exec(was.name);
      var host = document.querySelector('.vl-figure[data-figure="' + was.grid + '"]');
      if (found && host) {
        host.setAttribute("data-rove", found[1] + "," + found[2]);
        host.setAttribute("data-refocus", ""); // drawn again after Back: wireHeatmap focuses
      }
    }
    if (el) el.focus({ preventScroll: true });
  }

  // --- drawing ---

  // A per-position chart (usermeta.positions) wraps into rows that fit the page: each token
  // gets a band wide enough for its rotated label (1.5 × the label size, wider for a short
  // prompt: it fills the card), as many per row as fit, the rows as even as they can be.
  function fitRows(spec, target) {
    var n = spec.usermeta && spec.usermeta.positions;
    if (!n || !spec.params || !spec.spec) return;
    var size = ((spec.config || {}).axis || {}).labelFontSize || 11;
    var room = Math.max(160, target.clientWidth - 7 * size - 24);
    var step = Math.max(Math.ceil(1.5 * size), Math.min(12 * size, Math.floor(room / n)));
    var rows = Math.ceil(n / Math.max(1, Math.floor(room / step)));
    var perRow = Math.ceil(n / rows);
    step = Math.max(step, Math.min(12 * size, Math.floor(room / perRow))); // the rows fill the card
    spec.params.forEach(function (param) {
      if (param.name === "perRow") param.value = perRow;
    });
    // several series side by side: the step is each bar's, a position holds them all and the
    // padding between positions (Vega-Lite's 0.1 of a band: 0.85 leaves room for it)
    var series = spec.usermeta.series || 1;
    spec.spec.width = { step: Math.max(2, Math.floor((series > 1 ? 0.85 * step : step) / series)) };
  }

  // A title wider than the figure is wrapped into lines that fit it (Vega would cut it off at
  // the drawing's edge): each top-level or concatenated chart's title, at its share of `width`.
  var measure = null;

  function textWidth(text, font) {
    if (!measure) measure = document.createElement("canvas").getContext("2d");
    measure.font = font;
    return measure.measureText(text).width;
  }

  function wrapLines(text, width, font) {
    var lines = [];
    var line = "";
    String(text).split(/\s+/).forEach(function (word) {
      var longer = line ? line + " " + word : word;
      if (line && textWidth(longer, font) > width) {
        lines.push(line);
        line = word;
      } else {
        line = longer;
      }
    });
    if (line) lines.push(line);
    return lines;
  }

  function wrapTitles(spec, width, config) {
    var title = (config && config.title) || {};
    var font = (title.fontWeight || 600) + " " + (title.fontSize || 14) + "px " + ((config && config.font) || "sans-serif");
    var t = spec.title;
    if (t && (typeof t === "string" || typeof t.text === "string")) {
      var text = typeof t === "string" ? t : t.text;
      var lines = wrapLines(text, Math.max(120, width - 16), font);
      if (lines.length > 1) spec.title = Object.assign(typeof t === "string" ? {} : t, { text: lines });
    }
    ["hconcat", "concat"].forEach(function (key) {
      (spec[key] || []).forEach(function (part) {
        wrapTitles(part, width / spec[key].length, config);
      });
    });
    (spec.vconcat || []).forEach(function (part) {
      wrapTitles(part, width, config);
    });
  }

  // --- the `auto` colour theme on a dark system: the page's light figures drawn dark ---

  var autoDarkTheme = null;

  function autoDark(host) {
    if (host.getAttribute("data-theme") !== "light") return null;
    var meta = document.querySelector('meta[name="figure-auto-dark"]');
    if (!meta || !window.matchMedia || !window.matchMedia("(prefers-color-scheme: dark)").matches) {
      return null;
    }
    if (!autoDarkTheme) autoDarkTheme = JSON.parse(meta.getAttribute("content"));
    return autoDarkTheme;
  }

  // the dark theme's config, and each light colour swapped for its dark one outside the data
  // (what the server's Figure.spec does for `dark`); the downloads follow the screen
  function darkened(host, spec, dark) {
    var out = {};
    Object.keys(spec).forEach(function (key) {
      if (key === "data" || key === "datasets") {
        out[key] = spec[key];
        return;
      }
      var text = JSON.stringify(spec[key]);
      Object.keys(dark.recolour).forEach(function (light) {
        text = text.split(light).join(dark.recolour[light]);
      });
      out[key] = JSON.parse(text);
    });
    out.config = dark.config;
    host.setAttribute("data-theme", "dark");
    host.setAttribute("data-auto-dark", "");
    var card = host.closest("figure");
    if (card) {
      card.querySelectorAll("a.download").forEach(function (link) {
        link.setAttribute("href", link.getAttribute("href").replace("theme=light", "theme=dark"));
      });
    }
    return out;
  }

  // a figure that fills its card downloads (SVG, PNG) as wide as it was drawn here; a
  // per-position chart, wrapped into the rows it has here (the server's fit_rows)
  function sameWidthDownloads(host, width) {
    var card = host.closest("figure");
    if (!card || !(width >= 200 && width <= 2400)) return;
    card.querySelectorAll("a.download[data-format=svg], a.download[data-format=png]").forEach(
      function (link) {
        var url = new URL(link.getAttribute("href"), window.location.href);
        url.searchParams.set("width", String(Math.round(width)));
        link.setAttribute("href", url.pathname + url.search);
      }
    );
  }

  // draws `host`'s figure; a promise settled once it is drawn (or could not be)
  function draw(host) {
    var source = host.getAttribute("data-spec");
    if (!source || !window.vegaEmbed) {
      if (host.getAttribute("data-drawn") === "queued") host.removeAttribute("data-drawn");
      return Promise.resolve();
    }
    host.setAttribute("data-drawn", "pending");
    var target = host.querySelector(".vl-view");
    if (!target) {
      target = document.createElement("div");
      target.className = "vl-view";
      host.appendChild(target);
    }
    var spec = JSON.parse(source);
    var dark = autoDark(host);
    if (dark) spec = darkened(host, spec, dark);
    fitRows(spec, target);
    wrapTitles(spec, target.clientWidth, spec.config);
    return window
      .vegaEmbed(target, spec, options(host))
      .then(function (result) {
        var preview = host.querySelector(".vl-preview"); // the server's first paint
        if (preview) preview.remove();
        host.setAttribute("data-drawn", "true");
        if (spec.width === "container") sameWidthDownloads(host, result.view.width());
        else if (spec.usermeta && spec.usermeta.positions) sameWidthDownloads(host, target.clientWidth);
        localPaintRefs(host);
        if (CLICKABLE.indexOf(host.getAttribute("data-figure")) >= 0) wireHeatmap(host, result.view);
      })
      .catch(function (error) {
        host.setAttribute("data-drawn", "failed");
        target.textContent = "This figure could not be drawn: " + error;
      });
  }

  // Vega's SVG refers to its gradients (a heatmap's legend) by the page's absolute URL,
  // url(http://host/page#gradient_0): once a head's panel pushes another URL (?head=…, or a
  // patching page's direction) that points at another document and the legend's gradient
  // vanishes. A fragment alone always means this document.
  function localPaintRefs(root) {
    root.querySelectorAll(".vl-figure svg [fill^='url('], .vl-figure svg [stroke^='url(']").forEach(
      function (el) {
        ["fill", "stroke"].forEach(function (name) {
          var value = el.getAttribute(name) || "";
          var found = /^url\((?:[^)#]*)(#[^)]+)\)$/.exec(value);
          if (found) el.setAttribute(name, "url(" + found[1] + ")");
        });
      }
    );
  }

  // The heatmaps first (what a click waits for: on the analysis page, the figure below the
  // layer and flow charts), the other figures once they are painted: Vega's drawing of each
  // figure holds the main thread, so drawn in page order the heatmap would wait for them all.
  function drawAll() {
    var hosts = Array.prototype.slice.call(
      document.querySelectorAll(".vl-figure[data-vl]:not([data-drawn])")
    );
    var first = hosts.filter(function (host) {
      return CLICKABLE.indexOf(host.getAttribute("data-figure")) >= 0;
    });
    var rest = hosts.filter(function (host) {
      return first.indexOf(host) < 0;
    });
    if (!first.length) {
      rest.forEach(draw);
      return;
    }
    rest.forEach(function (host) {
      host.setAttribute("data-drawn", "queued"); // not drawn twice meanwhile
    });
    Promise.all(first.map(draw)).then(function () {
      requestAnimationFrame(function () {
        setTimeout(function () {
          rest.forEach(draw); // after the heatmap's frame is painted
        }, 0);
      });
    });
  }

  // htmx keeps each page's markup for the Back button and parses it again there: the style
  // attributes Vega and its tooltip set through the CSSOM would then be inline styles the CSP
  // refuses. They leave the markup while htmx copies it and come back at once after.
  document.addEventListener("htmx:beforeHistorySave", function () {
    var styled = [];
    document.body.querySelectorAll("[style]").forEach(function (el) {
      styled.push([el, el.getAttribute("style")]);
      el.removeAttribute("style");
    });
    setTimeout(function () {
      styled.forEach(function (pair) {
        pair[0].style.cssText = pair[1]; // the CSSOM: allowed where style attributes are not
      });
    }, 0);
  });

  // htmx's history keeps the drawn SVG without its listeners: draw those figures again
  // the system switches between light and dark while the page is open: its `auto` figures
  // are drawn again in the new colours (and their downloads follow)
  function followSystemScheme() {
    if (!document.querySelector('meta[name="figure-auto-dark"]')) return;
    document.querySelectorAll(".vl-figure[data-vl][data-drawn]").forEach(function (host) {
      if (host.hasAttribute("data-auto-dark")) {
        host.removeAttribute("data-auto-dark");
        host.setAttribute("data-theme", "light");
        var card = host.closest("figure");
        if (card) {
          card.querySelectorAll("a.download").forEach(function (link) {
            link.setAttribute("href", link.getAttribute("href").replace("theme=dark", "theme=light"));
          });
        }
      }
      if (host.getAttribute("data-theme") !== "light") return; // a page themed on purpose
      var view = host.querySelector(".vl-view");
      if (view) view.textContent = "";
      host.removeAttribute("data-drawn");
    });
    drawAll();
  }
  if (window.matchMedia) {
    var scheme = window.matchMedia("(prefers-color-scheme: dark)");
    if (scheme.addEventListener) scheme.addEventListener("change", followSystemScheme);
  }

  function redrawRestored() {
    document.querySelectorAll(".vl-figure[data-vl][data-drawn]").forEach(function (host) {
      host.removeAttribute("data-drawn");
    });
    drawAll();
  }

  // A head opened while the finished analysis' body was on its way (its request carried the
  // URL from before the click) is opened again in the body that replaced it: once per panel.
  // A click's answer that arrives after the body was replaced lands in the old, detached
  // panel (and only then puts ?head= in the address): the head asked for last is opened again
  // in the new panel too.
  function forget() {
    asked = null; // a later click, link or Back decides what is open
  }
  document.addEventListener("click", forget, true);
  window.addEventListener("popstate", forget);
  function keepOpenHead() {
    var match = /[?&]head=(L\d+H\d+)/.exec(window.location.search);
    var name = asked || (match && match[1]);
    var panel = document.getElementById("head-panel");
    var root = document.querySelector("[data-heads-url]");
    if (!name || !panel || !root || !window.htmx) return;
    if (panel.querySelector(":scope > :not(.hint)") || panel.hasAttribute("hx-get")) return;
    if (panel.getAttribute("data-opening") === name) return; // its own answer is on the way
    if (panel.getAttribute("data-reopened") === name) return;
    panel.setAttribute("data-reopened", name);
    window.htmx.ajax("GET", root.getAttribute("data-heads-url") + "/heads/" + name, {
      target: "#head-panel",
      swap: "innerHTML",
    });
  }

  // Vega is preloaded by the page's <link rel=preload data-vega> and run here, in order,
  // after the first paint (its ~0.8 MB would otherwise hold the paint back); then it draws.
  function loadVega() {
    var links = document.querySelectorAll("link[data-vega]");
    if (window.vegaEmbed || !links.length) {
      drawAll();
      return;
    }
    links.forEach(function (link, i) {
      var script = document.createElement("script");
      script.src = link.getAttribute("href");
      script.async = false; // run in the order inserted: vega, vega-lite, vega-embed
      if (i === links.length - 1) script.addEventListener("load", drawAll);
      document.head.appendChild(script);
    });
  }

  function afterFirstPaint() {
    requestAnimationFrame(function () {
      setTimeout(loadVega, 0);
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", afterFirstPaint);
    document.addEventListener("DOMContentLoaded", function () {
      roveRows(document);
    });
  } else {
    afterFirstPaint();
    roveRows(document);
  }
  // figures arrive in htmx swaps of every kind (boosted pages, polled partials, the head
  // panel): one observer draws whatever new figure appears, once per frame
  var queued = false;
  new MutationObserver(function () {
    if (queued) return;
    queued = true;
    requestAnimationFrame(function () {
      // after this frame's paint: what arrived (the heatmap's server-drawn first paint) is on
      // screen before Vega's drawing takes the main thread
      setTimeout(function () {
        queued = false;
        drawAll();
      }, 0);
    });
  }).observe(document.documentElement, { childList: true, subtree: true });
  document.addEventListener("htmx:afterSettle", keepOpenHead);
  document.addEventListener("htmx:pushedIntoHistory", function () {
    localPaintRefs(document);
  });
  document.addEventListener("htmx:historyRestore", function () {
    refocusOpener();
    redrawRestored();
  });
})();
