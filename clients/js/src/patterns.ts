/**
 * Stream patterns, as the extension reads them (docs/reference.md,
 * "Wildcards and filters").
 *
 * A pattern is an exact name, `'*'` (every stream), a prefix ending in `*`
 * (`'order.*'`: any suffix), or segments of which some are `*`
 * (`'order.*.failed'`: exactly one whole segment each). Only an exact name
 * has a channel of its own; a pattern's channels are those of the streams it
 * matches, found by name ({@link nameRange}, then {@link matches}). The
 * database checks the pattern again (22023), so this module only has to
 * agree with it on valid patterns.
 *
 * @module
 */

/** Whether the pattern names one stream (and so one channel). */
export function isExact(pattern: string): boolean {
  return !pattern.includes("*");
}

/** Whether `pattern` selects `stream`. */
export function matches(pattern: string, stream: string): boolean {
  if (pattern === "*") return true;
  if (!pattern.includes("*")) return pattern === stream;
  let rest = stream;
  const segments = pattern.split(".");
  for (let i = 0; i < segments.length; i++) {
    const segment = segments[i]!;
    if (i === segments.length - 1) {
      if (segment.endsWith("*")) {
        const literal = segment.slice(0, -1);
        return !literal.includes("*") && rest.startsWith(literal);
      }
      return !segment.includes("*") && rest === segment;
    }
    if (segment === "*") {
      const end = rest.indexOf(".");
      if (end <= 0) return false;
      rest = rest.slice(end + 1);
    } else if (!segment || segment.includes("*") || !rest.startsWith(segment + ".")) {
      return false;
    } else {
      rest = rest.slice(segment.length + 1);
    }
  }
  return false;
}

/**
 * The half-open range `[low, high)` of names that can match: those starting
 * with the pattern's literal prefix (the text before its first `*`). Stream
 * names are ASCII, all below `'~'`.
 */
export function nameRange(pattern: string): [string, string] {
  const prefix = pattern.split("*", 1)[0]!;
  if (!prefix) return ["", "~"];
  if (!pattern.includes("*")) return [prefix, prefix + "\u0001"];
  return [prefix, prefix.slice(0, -1) + String.fromCharCode(prefix.charCodeAt(prefix.length - 1) + 1)];
}

/** The identifier `name` quoted for SQL (`LISTEN "order.eu"`). @internal */
export function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}
