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
/**
 * An error the database reported for a litebase_streams call.
 *
 * `sqlstate` is the SQLSTATE, `detail` and `hint` the server's errdetail and
 * errhint; `cause` the node-postgres error.
 */
export class StreamsError extends Error {
    /** The five-character SQLSTATE (undefined for errors of the library itself). */
    sqlstate;
    /** The server's errdetail, if any. */
    detail;
    /** The server's errhint, if any. */
    hint;
    constructor(message, options = {}) {
        super(message, options.cause === undefined ? undefined : { cause: options.cause });
        this.name = new.target.name;
        this.sqlstate = options.sqlstate ?? new.target.code;
        this.detail = options.detail;
        this.hint = options.hint;
    }
}
/** 22004: a required argument is null. */
export class NullArgumentError extends StreamsError {
    /** The SQLSTATE of this class. */
    static code = "22004";
}
/**
 * 22023: a bad stream name or pattern, envelope (`type`, `key`, `headers`),
 * idempotency key, or an argument out of range; nothing was written.
 */
export class InvalidArgumentError extends StreamsError {
    /** The SQLSTATE of this class. */
    static code = "22023";
}
/**
 * 23505: the idempotency key is remembered for other data or envelope. A
 * retry must repeat the original exactly; a new event needs a new key.
 */
export class IdempotencyConflictError extends StreamsError {
    /** The SQLSTATE of this class. */
    static code = "23505";
}
/**
 * 40001: `expectedPrev` is not the stream's newest event (`detail` names the
 * actual one); read the stream head again and retry the transaction. (40001
 * is also PostgreSQL's serialization failure, which calls for the same retry.)
 */
export class ExpectedVersionMismatchError extends StreamsError {
    /** The SQLSTATE of this class. */
    static code = "40001";
}
/**
 * 42501: the role lacks the `read` or `publish` privilege on the stream
 * (`streams.grant`), or is not a member of a subscription's owner.
 */
export class PermissionDeniedError extends StreamsError {
    /** The SQLSTATE of this class. */
    static code = "42501";
}
/** 42704: an unknown subscription or webhook. */
export class NotFoundError extends StreamsError {
    /** The SQLSTATE of this class. */
    static code = "42704";
}
/** 54000: `data` larger than `litebase_streams.max_event_size`. */
export class EventTooLargeError extends StreamsError {
    /** The SQLSTATE of this class. */
    static code = "54000";
}
/**
 * 55000: an object not in the state the call needs (a nack of an event that
 * is not the caller's, a lease that expired, no worker running).
 */
export class InvalidStateError extends StreamsError {
    /** The SQLSTATE of this class. */
    static code = "55000";
}
/** 0A000: not supported (`PREPARE TRANSACTION` after publish or poll, a lease of an unordered subscription). */
export class NotSupportedError extends StreamsError {
    /** The SQLSTATE of this class. */
    static code = "0A000";
}
/** 25006: publishing on a standby; publish on the primary. */
export class ReadOnlyError extends StreamsError {
    /** The SQLSTATE of this class. */
    static code = "25006";
}
/**
 * The database's log is not the one the cursor belongs to.
 *
 * `streams.log_id()` is new after every `CREATE EXTENSION` (a re-created or
 * restored log) and positions start over in it, so a saved position means
 * nothing there. `oldLogId` is the cursor's, `newLogId` the database's.
 * Thrown by `subscribe` unless it was given `onLogChange: "restart"`.
 */
export class LogChangedError extends StreamsError {
    /** The log the cursor belonged to. */
    oldLogId;
    /** The log the database has now. */
    newLogId;
    constructor(oldLogId, newLogId) {
        super(`the log changed from ${oldLogId} to ${newLogId}: positions start over ` +
            "(the extension was re-created or the database restored)");
        this.oldLogId = oldLogId;
        this.newLogId = newLogId;
    }
}
const BY_SQLSTATE = new Map([
    NullArgumentError,
    InvalidArgumentError,
    IdempotencyConflictError,
    ExpectedVersionMismatchError,
    PermissionDeniedError,
    NotFoundError,
    EventTooLargeError,
    InvalidStateError,
    NotSupportedError,
    ReadOnlyError,
].map((cls) => [cls.code, cls]));
/** SQLSTATEs of a session that ended: the server shut down or terminated it. */
const SESSION_ENDED = new Set(["57P01", "57P02", "57P03"]);
/**
 * Whether `error` means the connection is gone (reconnect and go on): a
 * socket error, a connection that ended, class 08, or a terminated session
 * (57P01 to 57P03).
 */
export function isConnectionLost(error) {
    if (!(error instanceof Error))
        return false;
    if (error instanceof StreamsError)
        return false;
    const code = error.code;
    if (typeof code === "string") {
        if (/^[0-9A-Z]{5}$/.test(code))
            return code.startsWith("08") || SESSION_ENDED.has(code);
        return true; // ECONNRESET, ECONNREFUSED, EPIPE, ...
    }
    return /Connection terminated|connection closed|Client has encountered a connection error|not queryable|ended unexpectedly/i.test(error.message);
}
/** The {@link StreamsError} for a database error; other errors unchanged. */
export function translate(error) {
    if (!(error instanceof Error) || error instanceof StreamsError || isConnectionLost(error))
        return error;
    const e = error;
    if (typeof e.code !== "string" || !/^[0-9A-Z]{5}$/.test(e.code))
        return error;
    const cls = BY_SQLSTATE.get(e.code) ?? StreamsError;
    return new cls(e.message, { sqlstate: e.code, detail: e.detail, hint: e.hint, cause: error });
}
/** Runs `fn`, throwing database errors as their {@link StreamsError}. */
export async function translated(fn) {
    try {
        return await fn();
    }
    catch (error) {
        throw translate(error);
    }
}
