//! `streams.capture` and `streams.uncapture`: checks as the caller, then
//! the capture triggers created or dropped as the extension's owner (the
//! only role with EXECUTE on `streams._capture`).
//!
//! What can be captured: an ordinary, permanent table outside the
//! extension's schema, neither partitioned nor a partition nor part of an
//! inheritance tree (a statement on a parent does not fire its children's
//! statement triggers, so changes would be missed), with a primary key or
//! REPLICA IDENTITY FULL. Capturing needs ownership of the table and the
//! publish privilege on the stream.

use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::error::{OrRaise, SpiContext, StreamsError};
use crate::log::{privileges, publish};
use litebase_streams_core::names::validate_stream_name;

/// The capture triggers' names, by event (AFTER triggers fire in name order).
const TRIGGERS: [(&str, &str, &str); 4] = [
    ("streams_capture_insert", "INSERT", "REFERENCING NEW TABLE AS streams_new"),
    ("streams_capture_update", "UPDATE", "REFERENCING OLD TABLE AS streams_old NEW TABLE AS streams_new"),
    ("streams_capture_delete", "DELETE", "REFERENCING OLD TABLE AS streams_old"),
    ("streams_capture_truncate", "TRUNCATE", ""),
];

/// What the checks read about the table.
struct Target {
    name: String,
    /// schema.table, each quoted as needed: what the triggers' SQL names.
    qualified: String,
    schema: String,
    table: String,
    kind: String,
    persistence: String,
    partition: bool,
    inherits: bool,
    replica_identity: String,
    owned: bool,
    in_extension_schema: bool,
    captured: bool,
    has_key: bool,
}

const TARGET: &str = "SELECT c.oid::pg_catalog.regclass::text, pg_catalog.format('%I.%I', n.nspname, c.relname), n.nspname::text, c.relname::text, c.relkind::text,
       c.relpersistence::text, c.relispartition,
       c.relhassubclass OR EXISTS (SELECT FROM pg_catalog.pg_inherits i WHERE i.inhrelid = c.oid),
       c.relreplident::text, pg_catalog.pg_has_role(c.relowner, 'USAGE'), n.nspname = 'streams',
       EXISTS (SELECT FROM pg_catalog.pg_trigger t
               WHERE t.tgrelid = c.oid AND t.tgfoid = 'streams._capture()'::pg_catalog.regprocedure),
       EXISTS (SELECT FROM pg_catalog.pg_index x WHERE x.indrelid = c.oid AND x.indisprimary)
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = $1";

fn target(client: &SpiClient<'_>, table: pg_sys::Oid) -> Target {
    let read = || -> Result<Target, pgrx::spi::Error> {
        let row = client.select(TARGET, Some(1), &[table.into()])?.first();
        Ok(Target {
            name: row.get(1)?.unwrap_or_default(),
            qualified: row.get(2)?.unwrap_or_default(),
            schema: row.get(3)?.unwrap_or_default(),
            table: row.get(4)?.unwrap_or_default(),
            kind: row.get(5)?.unwrap_or_default(),
            persistence: row.get(6)?.unwrap_or_default(),
            partition: row.get(7)?.unwrap_or(false),
            inherits: row.get(8)?.unwrap_or(false),
            replica_identity: row.get(9)?.unwrap_or_default(),
            owned: row.get(10)?.unwrap_or(false),
            in_extension_schema: row.get(11)?.unwrap_or(false),
            captured: row.get(12)?.unwrap_or(false),
            has_key: row.get(13)?.unwrap_or(false),
        })
    };
    read().context("reading the table to capture")
}

/// Lock the table as CREATE TRIGGER does, so that nothing changes it
/// between the checks and the triggers; only for the table's owner (42501
/// first, as LOCK TABLE does): anyone else's wait for the lock would queue
/// every later writer of the table behind it.
fn lock_owned(table: pg_sys::Oid) {
    // SAFETY: catalog lookups and a relation lock inside the caller's transaction; a missing
    // relation (a regclass whose table was dropped) is reported by the lookup that follows.
    unsafe {
        let name = pg_sys::get_rel_name(table);
        if !name.is_null() && !pg_sys::pg_class_ownercheck(table, pg_sys::GetUserId()) {
            StreamsError::NotTableOwner(std::ffi::CStr::from_ptr(name).to_string_lossy().into_owned()).raise();
        }
        pg_sys::LockRelationOid(table, pg_sys::ShareRowExclusiveLock as pg_sys::LOCKMODE);
    }
}

/// `streams.capture(tbl regclass, stream text, exclude text[]) → text`:
/// capture the table into `stream` (default `schema.table`); returns the stream.
#[pg_extern(sql = false)]
fn capture(table: Option<pg_sys::Oid>, stream: Option<&str>, exclude: Option<Vec<Option<String>>>) -> String {
    let table = table.ok_or(StreamsError::NullArgument("tbl")).or_raise();
    crate::require_preload().or_raise();
    lock_owned(table);
    Spi::connect_mut(|client| {
        let target = target(client, table);
        check_capturable(&target);
        let stream = match stream {
            Some(stream) => stream.to_owned(),
            None => format!("{}.{}", target.schema, target.table),
        };
        validate_stream_name(&stream).or_raise();
        let excluded = excluded_columns(client, table, &target.name, exclude.unwrap_or_default());
        let sequence = publish::position_sequence();
        privileges::check_publish(&stream, sequence);
        let mut arguments = vec![quote_literal(&stream)];
        arguments.extend(excluded.iter().map(|attnum| quote_literal(&attnum.to_string())));
        let owner = publish::log_owner(sequence);
        privileges::as_owner(owner, || {
            for (name, event, referencing) in TRIGGERS {
                let sql = format!(
                    "CREATE TRIGGER {name} AFTER {event} ON {table} {referencing} FOR EACH STATEMENT \
                     EXECUTE FUNCTION streams._capture({arguments})",
                    table = target.qualified,
                    arguments = arguments.join(", "),
                );
                client.update(&sql, None, &[]).context("creating the capture triggers");
            }
        });
        stream
    })
}

fn check_capturable(target: &Target) {
    let table = || target.name.clone();
    let kind = match target.kind.as_str() {
        "r" | "p" => None,
        "v" => Some("a view"),
        "m" => Some("a materialized view"),
        "f" => Some("a foreign table"),
        "S" => Some("a sequence"),
        "i" | "I" => Some("an index"),
        "c" => Some("a composite type"),
        _ => Some("not a table"),
    };
    if let Some(kind) = kind {
        StreamsError::CaptureNotATable { table: table(), kind }.raise();
    }
    let unsupported = if target.kind == "p" {
        Some("partitioned tables are not supported (a statement on a partition does not fire the parent's triggers)")
    } else if target.partition {
        Some("it is a partition")
    } else if target.inherits {
        Some("it is part of an inheritance tree")
    } else if target.persistence == "t" {
        Some("it is a temporary table")
    } else if target.in_extension_schema {
        Some("it belongs to litebase_streams")
    } else {
        None
    };
    if let Some(reason) = unsupported {
        StreamsError::CaptureUnsupported { table: table(), reason }.raise();
    }
    if !target.owned {
        StreamsError::NotTableOwner(table()).raise();
    }
    if target.captured {
        StreamsError::AlreadyCaptured(table()).raise();
    }
    if !target.has_key && target.replica_identity != "f" {
        StreamsError::CaptureWithoutKey(table()).raise();
    }
}

/// The attribute numbers of `exclude`'s columns: each a live column of the
/// table and not part of its primary key (the key is in every event); 22023 otherwise.
fn excluded_columns(client: &SpiClient<'_>, table: pg_sys::Oid, name: &str, exclude: Vec<Option<String>>) -> Vec<i16> {
    let mut attnums = Vec::new();
    for column in exclude {
        let column = column.ok_or(StreamsError::NullArgument("each element of exclude")).or_raise();
        let found = client
            .select(
                "SELECT a.attnum, EXISTS (SELECT FROM pg_catalog.pg_index x
                                   WHERE x.indrelid = a.attrelid AND x.indisprimary AND a.attnum = ANY (x.indkey))
                 FROM pg_catalog.pg_attribute a
                 WHERE a.attrelid = $1 AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
                Some(1),
                &[table.into(), column.as_str().into()],
            )
            .and_then(|rows| match rows.is_empty() {
                true => Ok((None, None)),
                false => {
                    let row = rows.first();
                    Ok((row.get::<i16>(1)?, row.get::<bool>(2)?))
                }
            })
            .context("reading the excluded columns");
        let invalid = |reason| StreamsError::InvalidExclude { table: name.to_owned(), column: column.clone(), reason };
        match found {
            (None, _) => invalid("the table has no such column").raise(),
            (Some(_), Some(true)) => invalid("it is part of the primary key, which every event carries").raise(),
            (Some(attnum), _) if !attnums.contains(&attnum) => attnums.push(attnum),
            _ => {}
        }
    }
    attnums
}

/// `streams.uncapture(tbl regclass)`: end the capture (drop its triggers).
#[pg_extern(sql = false)]
fn uncapture(table: Option<pg_sys::Oid>) {
    let table = table.ok_or(StreamsError::NullArgument("tbl")).or_raise();
    lock_owned(table);
    Spi::connect_mut(|client| {
        let target = target(client, table);
        if !target.owned {
            StreamsError::NotTableOwner(target.name).raise();
        }
        if !target.captured {
            StreamsError::NotCaptured(target.name).raise();
        }
        let triggers: Vec<String> = client
            .select(
                "SELECT pg_catalog.quote_ident(t.tgname) FROM pg_catalog.pg_trigger t
                 WHERE t.tgrelid = $1 AND t.tgfoid = 'streams._capture()'::pg_catalog.regprocedure",
                None,
                &[table.into()],
            )
            .and_then(|rows| rows.map(|row| row.get::<String>(1).map(Option::unwrap_or_default)).collect())
            .context("reading the capture triggers");
        let owner = publish::log_owner(publish::position_sequence());
        privileges::as_owner(owner, || {
            for trigger in triggers {
                let sql = format!("DROP TRIGGER {trigger} ON {}", target.qualified);
                client.update(&sql, None, &[]).context("dropping the capture triggers");
            }
        });
    })
}

/// `streams._capture_args(tgargs bytea) → text[]`: a trigger's arguments
/// (NUL-terminated strings) as an array, for `streams.captures`.
#[pg_extern(sql = false, immutable, strict, parallel_safe)]
fn _capture_args(arguments: &[u8]) -> Vec<String> {
    arguments.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
}

fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}
