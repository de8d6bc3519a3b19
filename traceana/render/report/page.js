// Sorting, and the drill-down: pick(key, value) keeps a filter per key (stage, rank; null drops it); a table shows
// the rows that match every filter it declares; the bars of every chart whose data source is named "pick:..." and
// has a filtered column are selected (a stage picks its ranks' bars); a banner says what is shown. A long table's
// filter box hides the rows whose text lacks what is typed (apart from the picks); the table of contents marks the
// section on screen.
const traceana = {
  picking: false,
  filters: {},
  pick(key, value) {
    if (this.picking) return;
    this.picking = true;
    try {
      if (value === null) delete this.filters[key]; else this.filters[key] = String(value);
      const active = Object.entries(this.filters);
      for (const table of document.querySelectorAll("table[data-filter]")) {
        const keys = table.dataset.filter.split(" ");
        for (const row of table.tBodies[0].rows)
          row.hidden = active.some(([k, v]) => keys.includes(k) && row.dataset[k] !== v);
      }
      for (const box of document.querySelectorAll("input.search")) this.search(box);
      for (const table of document.querySelectorAll("table[data-pick]")) {
        const k = table.dataset.pick;
        for (const row of table.tBodies[0].rows) row.classList.toggle("picked", this.filters[k] === row.dataset[k]);
      }
      if (window.Bokeh) for (const doc of Bokeh.documents) for (const source of doc.all_models) {
        if (!(source.name || "").startsWith("pick:")) continue;
        const keys = active.filter(([k]) => k in source.data);
        const n = keys.length ? source.data[keys[0][0]].length : 0;
        source.selected.indices = [...Array(n).keys()].filter((i) => keys.every(([k, v]) => String(source.data[k][i]) === v));
      }
      const banner = document.getElementById("filter");
      banner.hidden = active.length === 0;
      banner.innerHTML = active.length === 0 ? "" : `Showing ${active.map(([k, v]) => `${k} ${v}`).join(", ")} only. ` +
        '<a href="#" id="clear-filter">show all</a>';
      if (active.length) document.getElementById("clear-filter").onclick = (e) => {
        e.preventDefault();
        for (const k of Object.keys(traceana.filters)) traceana.pick(k, null);
      };
    } finally { this.picking = false; }
  },
  search(box) {
    const rows = box.parentNode.querySelector("table").tBodies[0].rows, text = box.value.trim().toLowerCase();
    let shown = 0, picked = 0;
    for (const row of rows) {
      row.classList.toggle("unmatched", text !== "" && !row.textContent.toLowerCase().includes(text));
      if (!row.hidden) { picked++; if (!row.classList.contains("unmatched")) shown++; }
    }
    box.nextElementSibling.textContent = shown === rows.length ? "" : `${shown} of ${picked} rows shown`;
  },
  sort(th) {
    const table = th.closest("table"), col = [...th.parentNode.children].indexOf(th);
    const numeric = th.classList.contains("n"), asc = !th.classList.contains("sorted-asc");
    for (const other of th.parentNode.children) other.classList.remove("sorted-asc", "sorted-desc");
    th.classList.add(asc ? "sorted-asc" : "sorted-desc");
    // a number sorts by its shown value (thousands separators dropped; an empty cell first)
    const value = (row) => {
      const text = row.cells[col].textContent;
      return numeric ? (text === "" ? -Infinity : Number(text.replace(/,/g, ""))) : text;
    };
    const rows = [...table.tBodies[0].rows].sort((a, b) => { const x = value(a), y = value(b); return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1); });
    table.tBodies[0].append(...rows);
  },
};
document.addEventListener("click", (event) => {
  const th = event.target.closest("table.data thead th");
  if (th) return traceana.sort(th);
  const row = event.target.closest("table[data-pick] tbody tr");
  if (row) { const key = row.closest("table").dataset.pick; traceana.pick(key, row.classList.contains("picked") ? null : row.dataset[key]); }
});
document.addEventListener("input", (event) => {
  if (event.target.matches("input.search")) traceana.search(event.target);
});
const here = new IntersectionObserver((seen) => {
  for (const entry of seen) if (entry.isIntersecting) for (const link of document.querySelectorAll("nav.toc a"))
    link.classList.toggle("here", link.getAttribute("href") === `#${entry.target.id}`);
}, { rootMargin: "0px 0px -80% 0px" });
for (const part of document.querySelectorAll("main > section")) here.observe(part);
