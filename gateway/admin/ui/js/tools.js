// A prompt version's tools, tool choice and rounds: how the console shows, edits and diffs them.

export const DEFAULT_CHOICE = 'auto';
export const DEFAULT_ROUNDS = 4;

/** A tool choice as text: "auto", "required", "none" or "function NAME". */
export function choiceLabel(choice) {
  if (!choice || typeof choice === 'string') return choice || DEFAULT_CHOICE;
  return `function ${choice.function && choice.function.name}`;
}

/** The choice a label stands for (the inverse of choiceLabel). */
export function choiceOf(label) {
  if (!label.startsWith('function ')) return label;
  return { type: 'function', function: { name: label.slice('function '.length) } };
}

export function toolNames(tools) {
  return (tools || []).map((t) => (t.function && t.function.name) || '?');
}

/** One line for a version's tools: "lookup_order, open_page · choice required · 2 rounds". */
export function toolSummary(version) {
  const names = toolNames(version.tools);
  if (!names.length) return 'none';
  return `${names.join(', ')} · choice ${choiceLabel(version.tool_choice)} · ${version.max_tool_rounds} rounds`;
}

/** The tools of the editor's JSON text: a list, or an Error saying what is wrong. */
export function parseTools(text) {
  const trimmed = text.trim();
  if (!trimmed) return [];
  let value;
  try {
    value = JSON.parse(trimmed);
  } catch (err) {
    return new Error(`Tools: not valid JSON (${err.message})`);
  }
  if (!Array.isArray(value)) return new Error('Tools: a JSON list of tool definitions, [] for none');
  return value;
}

const canonical = (value) => JSON.stringify(value, (key, v) => (
  v && typeof v === 'object' && !Array.isArray(v)
    ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, v[k]])) : v));

/** What changed from version a to b: [{op: 'add' | 'del' | 'chg', text}], tools by name. */
export function diffTools(a, b) {
  const byName = (v) => new Map((v.tools || []).map((t) => [toolNames([t])[0], t]));
  const before = byName(a);
  const after = byName(b);
  const out = [];
  for (const [name, tool] of after) {
    if (!before.has(name)) out.push({ op: 'add', text: `tool ${name}` });
    else if (canonical(before.get(name)) !== canonical(tool)) out.push({ op: 'chg', text: `tool ${name} changed` });
  }
  for (const name of before.keys()) {
    if (!after.has(name)) out.push({ op: 'del', text: `tool ${name}` });
  }
  const [ca, cb] = [choiceLabel(a.tool_choice), choiceLabel(b.tool_choice)];
  if (ca !== cb) out.push({ op: 'chg', text: `tool choice: ${ca} → ${cb}` });
  if (a.max_tool_rounds !== b.max_tool_rounds) {
    out.push({ op: 'chg', text: `max tool rounds: ${a.max_tool_rounds} → ${b.max_tool_rounds}` });
  }
  return out;
}
