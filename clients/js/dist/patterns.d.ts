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
export declare function isExact(pattern: string): boolean;
/** Whether `pattern` selects `stream`. */
export declare function matches(pattern: string, stream: string): boolean;
/**
 * The half-open range `[low, high)` of names that can match: those starting
 * with the pattern's literal prefix (the text before its first `*`). Stream
 * names are ASCII, all below `'~'`.
 */
export declare function nameRange(pattern: string): [string, string];
/** The identifier `name` quoted for SQL (`LISTEN "order.eu"`). @internal */
export declare function quoteIdent(name: string): string;
