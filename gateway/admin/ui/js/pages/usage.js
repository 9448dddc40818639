// Usage charts from the ledger: tokens per hour or day, and the table behind the chart.
import { api, enc } from '../api.js';
import { clear, field, h, svg, table } from '../dom.js';
import { busy } from '../ui.js';

const RANGES = { '24h': [24, 'hour'], '7d': [24 * 7, 'day'], '30d': [24 * 30, 'day'] };

function hourFloor(d) { const x = new Date(d); x.setUTCMinutes(0, 0, 0); return x; }

export async function renderUsage(el, ctx, tenant) {
  const sel = h('select', { id: 'usage-range' }, Object.keys(RANGES).map((k) => h('option', { value: k }, `last ${k}`)));
  const out = h('div', { id: 'usage-out' });
  el.append(h('section', { class: 'card', 'aria-labelledby': 'u-title' }, h('h2', { id: 'u-title' }, 'Usage'),
    field('Range', sel)[0], out));
  const load = async () => {
    const [hours, group] = RANGES[sel.value];
    const end = new Date(hourFloor(Date.now()).getTime() + 3600e3);
    const start = new Date(end.getTime() - hours * 3600e3);
    const q = `start=${enc(start.toISOString())}&end=${enc(end.toISOString())}&group_by=${group}&limit=1000`;
    const rep = await busy('Loading usage', () => api('GET', `/tenants/${enc(tenant.id)}/usage?${q}`));
    if (rep) draw(clear(out), rep.data, timeline(rep.data, start, end, group));
  };
  sel.addEventListener('change', load);
  await load();
}

/** Every bucket of the range, zeros where the ledger has none (its rows when they do not fit
 * the grid, e.g. days of a budget time zone that is not UTC). */
function timeline(rows, start, end, group) {
  const step = group === 'hour' ? 3600e3 : 86400e3;
  const first = group === 'hour' ? start.getTime() : Date.UTC(start.getUTCFullYear(), start.getUTCMonth(), start.getUTCDate());
  const byTime = new Map(rows.map((r) => [Date.parse(r.group), r]));
  const grid = [];
  for (let t = first; t < end.getTime(); t += step) {
    grid.push(byTime.get(t) || { group: new Date(t).toISOString().replace('.000', ''), total_tokens: 0 });
  }
  const fits = rows.every((r) => grid.includes(r));
  return fits ? grid : rows;
}

function draw(el, rows, buckets) {
  if (!rows.length) { el.append(h('p', { class: 'hint' }, 'No usage in this range.')); return; }
  const max = Math.max(...buckets.map((r) => r.total_tokens), 1);
  const w = 600; const ht = 180; const bw = w / buckets.length;
  const chart = svg('svg', { class: 'chart', viewBox: `0 0 ${w} ${ht + 20}`, role: 'img',
    'aria-label': `Total tokens per bucket, at most ${max}` });
  buckets.forEach((r, i) => {
    if (!r.total_tokens) return;
    const bh = Math.max(1, (r.total_tokens / max) * ht);
    chart.append(svg('rect', { x: i * bw + 1, y: ht - bh, width: Math.max(1, bw - 2), height: bh },
      svg('title', {}, `${r.group}: ${r.total_tokens} tokens`)));
  });
  const first = buckets[0].group;
  const last = buckets[buckets.length - 1].group;
  chart.append(svg('line', { x1: 0, y1: ht, x2: w, y2: ht, stroke: '#d5dae0' }),
    svg('text', { x: 0, y: ht + 14 }, first), svg('text', { x: w, y: ht + 14, 'text-anchor': 'end' }, last),
    svg('text', { x: 0, y: 10 }, `${max} tokens`));
  el.append(chart, table(['Bucket', 'Requests', 'Prompt', 'Cached', 'Completion', 'Total', 'Spend (USD)'],
    rows.map((r) => [r.group, String(r.requests), String(r.prompt_tokens), String(r.cached_tokens),
      String(r.completion_tokens), String(r.total_tokens), r.spend_usd.toFixed(4)])));
}
