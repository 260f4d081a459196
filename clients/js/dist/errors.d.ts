/**
 * The errors this library throws.
 *
 * Every error the extension raises carries a SQLSTATE (docs/reference.md,
 * "Errors"). A node-postgres error with a SQLSTATE becomes the
 * {@link StreamsError} subclass its code names (the original stays as
 * `cause`), so a caller can catch {@link ExpectedVersionMismatchError}
 * instead of comparing codes. A SQLSTATE without a class of its own becomes
 * a plain {@link StreamsError}. Lost connections are not translated: they
 * stay node-postgres's errors, which `subscribe` and `consume` handle by
 * reconnecting.
 *
 * @module
 */
/** Options of a {@link StreamsError}. */
export interface StreamsErrorOptions {
    /** The five-character SQLSTATE. */
    sqlstate?: string;
    /** The server's errdetail. */
    detail?: string;
    /** The server's errhint. */
    hint?: string;
    /** The error this one translates (node-postgres's). */
    cause?: unknown;
}
/**
 * An error the database reported for a litebase_streams call.
 *
 * `sqlstate` is the SQLSTATE, `detail` and `hint` the server's errdetail and
 * errhint; `cause` the node-postgres error.
 */
export declare class StreamsError extends Error {
    /** The five-character SQLSTATE (undefined for errors of the library itself). */
    readonly sqlstate: string | undefined;
    /** The server's errdetail, if any. */
    readonly detail: string | undefined;
    /** The server's errhint, if any. */
    readonly hint: string | undefined;
    constructor(message: string, options?: StreamsErrorOptions);
}
/** 22004: a required argument is null. */
export declare class NullArgumentError extends StreamsError {
    /** The SQLSTATE of this class. */
    static readonly code = "22004";
}
/**
 * 22023: a bad stream name or pattern, envelope (`type`, `key`, `headers`),
 * idempotency key, or an argument out of range; nothing was written.
 */
export declare class InvalidArgumentError extends StreamsError {
    /** The SQLSTATE of this class. */
    static readonly code = "22023";
}
/**
 * 23505: the idempotency key is remembered for other data or envelope. A
 * retry must repeat the original exactly; a new event needs a new key.
 */
export declare class IdempotencyConflictError extends StreamsError {
    /** The SQLSTATE of this class. */
    static readonly code = "23505";
}
/**
 * 40001: `expectedPrev` is not the stream's newest event (`detail` names the
 * actual one); read the stream head again and retry the transaction. (40001
 * is also PostgreSQL's serialization failure, which calls for the same retry.)
 */
export declare class ExpectedVersionMismatchError extends StreamsError {
    /** The SQLSTATE of this class. */
    static readonly code = "40001";
}
/**
 * 42501: the role lacks the `read` or `publish` privilege on the stream
 * (`streams.grant`), or is not a member of a subscription's owner.
 */
export declare class PermissionDeniedError extends StreamsError {
    /** The SQLSTATE of this class. */
    static readonly code = "42501";
}
/** 42704: an unknown subscription or webhook. */
export declare class NotFoundError extends StreamsError {
    /** The SQLSTATE of this class. */
    static readonly code = "42704";
}
/** 54000: `data` larger than `litebase_streams.max_event_size`. */
export declare class EventTooLargeError extends StreamsError {
    /** The SQLSTATE of this class. */
    static readonly code = "54000";
}
/**
 * 55000: an object not in the state the call needs (a nack of an event that
 * is not the caller's, a lease that expired, no worker running).
 */
export declare class InvalidStateError extends StreamsError {
    /** The SQLSTATE of this class. */
    static readonly code = "55000";
}
/** 0A000: not supported (`PREPARE TRANSACTION` after publish or poll, a lease of an unordered subscription). */
export declare class NotSupportedError extends StreamsError {
    /** The SQLSTATE of this class. */
    static readonly code = "0A000";
}
/** 25006: publishing on a standby; publish on the primary. */
export declare class ReadOnlyError extends StreamsError {
    /** The SQLSTATE of this class. */
    static readonly code = "25006";
}
/**
 * The database's log is not the one the cursor belongs to.
 *
 * `streams.log_id()` is new after every `CREATE EXTENSION` (a re-created or
 * restored log) and positions start over in it, so a saved position means
 * nothing there. `oldLogId` is the cursor's, `newLogId` the database's.
 * Thrown by `subscribe` unless it was given `onLogChange: "restart"`.
 */
export declare class LogChangedError extends StreamsError {
    /** The log the cursor belonged to. */
    readonly oldLogId: string | null;
    /** The log the database has now. */
    readonly newLogId: string | null;
    constructor(oldLogId: string | null, newLogId: string | null);
}
/**
 * Whether `error` means the connection is gone (reconnect and go on): a
 * socket error, a connection that ended, class 08, or a terminated session
 * (57P01 to 57P03).
 */
export declare function isConnectionLost(error: unknown): boolean;
/** The {@link StreamsError} for a database error; other errors unchanged. */
export declare function translate(error: unknown): unknown;
/** Runs `fn`, throwing database errors as their {@link StreamsError}. */
export declare function translated<T>(fn: () => Promise<T>): Promise<T>;
