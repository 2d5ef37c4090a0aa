// Remembers the analyses this browser opened (id and the prompt's start, newest first, at most
// 20, in localStorage) and offers them in every "compare with…" list.
(function () {
  "use strict";
  var KEY = "icl-recent-analyses";
  var MAX = 20;

  function load() {
    try {
      var list = JSON.parse(window.localStorage.getItem(KEY) || "[]");
      return Array.isArray(list) ? list : [];
    } catch (e) {
      return [];
    }
  }

  function save(list) {
    try {
      window.localStorage.setItem(KEY, JSON.stringify(list.slice(0, MAX)));
    } catch (e) {
      /* storage off or full: the paste box still works */
    }
  }

  function remember() {
    var page = document.querySelector("#analysis[data-job]");
    if (!page) return;
    var id = page.getAttribute("data-job");
    if (!/^a-[0-9a-f]{32}$/.test(id)) return;
    var prompt = page.querySelector("[data-prompt]");
    var text = prompt ? prompt.textContent.trim().slice(0, 80) : "";
    var list = load().filter(function (entry) { return entry && entry.id !== id; });
    if (!text) {
      var old = load().filter(function (entry) { return entry && entry.id === id; })[0];
      text = old ? old.prompt : "";
    }
    list.unshift({ id: id, prompt: text });
    save(list);
  }

  function offer() {
    var lists = document.querySelectorAll("datalist[data-recent-for]");
    var recent = load();
    lists.forEach(function (datalist) {
      var self = datalist.getAttribute("data-recent-for");
      datalist.textContent = "";
      recent.forEach(function (entry) {
        if (!entry || entry.id === self) return;
        var option = document.createElement("option");
        option.value = entry.id;
        option.label = entry.prompt || entry.id;
        datalist.appendChild(option);
      });
    });
  }

  function refresh() {
    remember();
    offer();
  }

  document.addEventListener("DOMContentLoaded", refresh);
  document.addEventListener("htmx:afterSettle", refresh);
})();
