// The report page's charts, drawn as plain SVG: stacked bars and a heatmap. Loaded before
// report.js, it defines window.PatrollerCharts and nothing else. Colours come from classes
// (report.css), so that the charts follow the light or dark setting as the page does; every
// text is put in as text (textContent), never as markup.
"use strict";

window.PatrollerCharts = (function () {
  const SVG = "http://www.w3.org/2000/svg";

  function el(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined) continue;
      if (key === "data") {
        for (const [k, v] of Object.entries(value)) node.dataset[k] = String(v);
      } else {
        node.setAttribute(key, String(value));
      }
    }
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  // A round top for an axis: 1, 2 or 5 times a power of ten, at or above `most`.
  function niceTop(most) {
    if (!(most > 0)) return 1;
    const power = Math.pow(10, Math.floor(Math.log10(most)));
    for (const step of [1, 2, 2.5, 5, 10]) {
      if (step * power >= most) return step * power;
    }
    return 10 * power;
  }

  // An axis's tick: as few digits as it needs (0, 2.5, 10, 250).
  function tick(value) {
    if (value >= 100) return String(Math.round(value));
    if (value >= 10) return value.toFixed(1).replace(/\.0$/, "");
    return value.toFixed(2).replace(/\.?0+$/, "") || "0";
  }

  // GPU-hours as `patroller report` says them (patroller/cli/usage.py hours_text), one rule
  // for both: 0, <0.01 for a little (never 0 beside a share), 0.25, 12.5, 1234.
  function hours(value) {
    if (!(value > 0)) return "0";
    if (value < 0.01) return "<0.01";
    return value < 10 ? value.toFixed(2) : value < 1000 ? value.toFixed(1) : value.toFixed(0);
  }

  // Stacked bars: a column per label, a segment per series, bottom up in the series' order.
  //   columns: [{key, label}], series: [{key, label, className}],
  //   value(columnKey, seriesKey) -> number (GPU-hours), unit: "GPU-h", width, height.
  // Each segment is a <rect class="seg {className}"> with data-column, data-series and
  // data-value (what it stands for), and a <title>; the <svg> carries data-scale (pixels per
  // unit), so that what is drawn can be read back.
  function stackedBars(opts) {
    const width = Math.max(opts.width || 600, 240), height = opts.height || 260;
    const left = 48, right = 8, top = 10, bottom = 34;
    const plotW = width - left - right, plotH = height - top - bottom;
    const stacks = opts.columns.map((column) => {
      let sum = 0;
      const parts = opts.series.map((series) => {
        const value = Math.max(0, opts.value(column.key, series.key) || 0);
        sum += value;
        return {series, value};
      });
      return {column, parts, sum};
    });
    const topValue = niceTop(Math.max(0, ...stacks.map((s) => s.sum)));
    const scale = plotH / topValue;
    const svg = el("svg", {class: "chart bars", viewBox: `0 0 ${width} ${height}`, width, height,
                           role: "img", data: {scale, top: topValue}});
    if (opts.title) svg.append(el("title", {}, opts.title));
    const grid = el("g", {class: "grid"});
    for (let n = 0; n <= 4; n++) {
      const value = topValue * n / 4, y = top + plotH - value * scale;
      grid.append(el("line", {x1: left, x2: width - right, y1: y, y2: y}));
      grid.append(el("text", {x: left - 6, y: y + 4, "text-anchor": "end", class: "tick"},
                     tick(value)));
    }
    grid.append(el("text", {x: 4, y: top + 4, class: "unit", transform: `rotate(90 4 ${top + 4})`},
                   opts.unit || ""));
    svg.append(grid);
    const slot = plotW / Math.max(1, stacks.length);
    const barW = Math.max(1, Math.min(40, slot * 0.78));
    const every = Math.max(1, Math.ceil(46 / slot));  // a label every few columns when narrow
    const bars = el("g", {class: "stacks"});
    stacks.forEach((stack, n) => {
      const x = left + n * slot + (slot - barW) / 2;
      const group = el("g", {class: "stack", data: {column: stack.column.key, value: stack.sum}});
      let y = top + plotH;
      for (const part of stack.parts) {
        if (part.value <= 0) continue;
        const h = part.value * scale;
        y -= h;
        const rect = el("rect", {class: "seg " + (part.series.className || ""), x, y, width: barW,
                                 height: h, data: {column: stack.column.key,
                                                   series: part.series.key, value: part.value}});
        rect.append(el("title", {}, `${stack.column.label}: ${part.series.label}, ` +
                                    `${hours(part.value)} ${opts.unit || ""}`));
        group.append(rect);
      }
      bars.append(group);
      if (n % every === 0) {
        bars.append(el("text", {x: x + barW / 2, y: height - bottom + 14, "text-anchor": "middle",
                                class: "tick"}, stack.column.short || stack.column.label));
      }
    });
    svg.append(bars);
    svg.append(el("line", {class: "axis", x1: left, x2: width - right, y1: top + plotH,
                           y2: top + plotH}));
    return svg;
  }

  // A heatmap: a row per row label, a column per column label, each cell's shade its value's
  // part of the largest. value(rowKey, columnKey) -> number. Each cell is a <rect class="cell">
  // with data-row, data-column, data-value and a <title>.
  function heatmap(opts) {
    const width = Math.max(opts.width || 600, 240);
    const left = 40, top = 18, gap = 2;
    const cellW = Math.max(6, (width - left) / opts.columns.length - gap);
    const cellH = Math.min(28, Math.max(12, cellW));
    const height = top + opts.rows.length * (cellH + gap);
    let most = 0;
    for (const row of opts.rows) {
      for (const column of opts.columns) most = Math.max(most, opts.value(row.key, column.key) || 0);
    }
    const svg = el("svg", {class: "chart heat", viewBox: `0 0 ${width} ${height}`, width, height,
                           role: "img", data: {most}});
    if (opts.title) svg.append(el("title", {}, opts.title));
    const every = Math.max(1, Math.ceil(22 / (cellW + gap)));
    opts.columns.forEach((column, c) => {
      if (c % every !== 0) return;
      svg.append(el("text", {x: left + c * (cellW + gap) + cellW / 2, y: top - 6,
                             "text-anchor": "middle", class: "tick"}, column.label));
    });
    opts.rows.forEach((row, r) => {
      const y = top + r * (cellH + gap);
      svg.append(el("text", {x: left - 6, y: y + cellH / 2 + 4, "text-anchor": "end",
                             class: "tick"}, row.label));
      opts.columns.forEach((column, c) => {
        const value = Math.max(0, opts.value(row.key, column.key) || 0);
        const cell = el("rect", {class: value > 0 ? "cell" : "cell zero",
                                 x: left + c * (cellW + gap), y, width: cellW, height: cellH,
                                 rx: 2, data: {row: row.key, column: column.key, value}});
        if (value > 0) cell.setAttribute("fill-opacity", (0.12 + 0.88 * value / most).toFixed(3));
        cell.append(el("title", {}, `${row.label} ${column.label}: ${hours(value)} ` +
                                    (opts.unit || "")));
        svg.append(cell);
      });
    });
    return svg;
  }

  return Object.freeze({stackedBars, heatmap, hours});
})();
