//! Statements that backends plan once and keep: the publish INSERTs and the
//! publish privilege check.
//!
//! A kept plan is prepared and executed under `search_path = pg_catalog,
//! pg_temp` whatever the caller's setting (PostgreSQL re-parses a cached
//! statement under the current search_path when it differs from the one it
//! was planned under): a role that puts its own schema first cannot make the
//! extension's statements resolve to its functions or operators. The
//! statements also qualify every name.

use std::cell::Cell;
use std::ffi::CStr;
use std::thread::LocalKey;

use pgrx::prelude::*;

use crate::error::StreamsError;

/// A statement planned once per backend and kept; the plan cache re-plans it
/// when the tables change (even a dropped and recreated extension).
pub struct KeptPlan<const N: usize> {
    pub sql: &'static CStr,
    pub types: [pg_sys::Oid; N],
    pub plan: LocalKey<Cell<pg_sys::SPIPlanPtr>>,
}

impl<const N: usize> KeptPlan<N> {
    /// Execute with `values` (no nulls); raise unless SPI answers `expected`.
    ///
    /// # Safety
    /// SAFETY: call between `spi::connect` and `spi::finish`, with `values` of `self.types`; the
    /// plan is kept (SPI_keepplan), so it outlives SPI_finish and the transaction.
    pub unsafe fn execute(&'static self, values: &mut [pg_sys::Datum; N], expected: u32) {
        self.execute_with_nulls(values, None, expected)
    }

    /// [`execute`](Self::execute) with `nulls[i]` true where value `i` is null.
    ///
    /// # Safety
    /// SAFETY: as for `execute`; a null value's datum is not read.
    pub unsafe fn execute_with_nulls(
        &'static self,
        values: &mut [pg_sys::Datum; N],
        nulls: Option<[bool; N]>,
        expected: u32,
    ) {
        self.run(values, nulls, false, expected)
    }

    /// [`execute`](Self::execute) of a SELECT in read-only mode: under the
    /// caller's snapshot, without a command counter increment, so that it
    /// may run in a parallel query (a STABLE, PARALLEL SAFE function's
    /// statement; PostgreSQL refuses to start a read-write one there).
    ///
    /// # Safety
    /// SAFETY: as for `execute`.
    pub unsafe fn execute_read_only(&'static self, values: &mut [pg_sys::Datum; N], expected: u32) {
        self.run(values, None, true, expected)
    }

    /// # Safety
    /// SAFETY: as for `execute`.
    unsafe fn run(
        &'static self,
        values: &mut [pg_sys::Datum; N],
        nulls: Option<[bool; N]>,
        read_only: bool,
        expected: u32,
    ) {
        let flags = nulls.map(|nulls| nulls.map(|null| if null { b'n' } else { b' ' } as std::ffi::c_char));
        let flags_ptr = flags.as_ref().map_or(std::ptr::null(), |f| f.as_ptr());
        // The plan cache re-parses a statement under the search_path of the
        // moment whenever it differs from the one it was planned under, so
        // execution is pinned too (which also saves that re-parse).
        let status = with_pinned_search_path(|| {
            let mut plan = self.plan.with(|p| p.get());
            if plan.is_null() {
                let mut types = self.types;
                plan = pg_sys::SPI_prepare(self.sql.as_ptr(), N as i32, types.as_mut_ptr());
                if plan.is_null() || pg_sys::SPI_keepplan(plan) != 0 {
                    StreamsError::Spi { doing: "preparing a statement", error: format!("{:?}", self.sql) }.raise();
                }
                self.plan.with(|p| p.set(plan));
            }
            pg_sys::SPI_execute_plan(plan, values.as_mut_ptr(), flags_ptr, read_only, 0)
        });
        if status != expected as i32 {
            StreamsError::Spi { doing: "running a statement", error: format!("{:?}: SPI status {status}", self.sql) }
                .raise();
        }
    }
}

/// The search_path every statement of the extension runs under.
const PINNED_SEARCH_PATH: (&CStr, &CStr) = (c"search_path", c"pg_catalog, pg_temp");

/// Run `body` with `search_path = pg_catalog, pg_temp`, restoring the
/// caller's setting afterwards (when `body` raises, the transaction or
/// subtransaction abort unwinds the GUC nest level instead).
pub fn with_pinned_search_path<R>(body: impl FnOnce() -> R) -> R {
    with_settings(&[PINNED_SEARCH_PATH], body)
}

/// As [`with_pinned_search_path`], and with `enable_seqscan = off`: for
/// the statements on the subscriptions' bookkeeping tables, which churn (a
/// row per delivery, per key) and hold mostly dead rows between VACUUMs. A
/// plan made while such a table looked empty (seq scan) is kept by the
/// backend's plan cache and scanned every dead row on every call; with the
/// setting, the plans use the indexes the statements are written for.
pub fn with_index_plans<R>(body: impl FnOnce() -> R) -> R {
    with_settings(&[PINNED_SEARCH_PATH, (c"enable_seqscan", c"off")], body)
}

/// Run `body` with `settings` (name, value), restoring the caller's values
/// afterwards (when `body` raises, the transaction or subtransaction abort
/// unwinds the GUC nest level instead).
fn with_settings<R>(settings: &[(&CStr, &CStr)], body: impl FnOnce() -> R) -> R {
    // SAFETY: the calls fmgr_security_definer makes for a function's SET
    // clause; an ERROR in between is cleaned up by AtEOXact_GUC at abort.
    unsafe {
        let nest = pg_sys::NewGUCNestLevel();
        for (name, value) in settings {
            pg_sys::set_config_option(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_USERSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            );
        }
        let result = body();
        pg_sys::AtEOXact_GUC(true, nest);
        result
    }
}

/// Thin, raising wrappers around SPI's connect and finish.
pub mod spi {
    use super::*;

    /// # Safety
    /// SAFETY: call inside a transaction, and pair with [`finish`] in the same function call.
    pub unsafe fn connect() {
        if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as i32 {
            StreamsError::Spi { doing: "SPI_connect", error: "SPI_connect did not return SPI_OK_CONNECT".into() }
                .raise();
        }
    }

    /// # Safety
    /// SAFETY: call after [`connect`], in the same function call.
    pub unsafe fn finish() {
        pg_sys::SPI_finish();
    }

    /// The first column of every row of the last result, as bigints
    /// (nulls left out).
    ///
    /// # Safety
    /// SAFETY: call after a successful statement through SPI whose first column is a bigint,
    /// before [`finish`]: SPI_tuptable then holds that result.
    pub unsafe fn int8_column() -> Vec<i64> {
        let table = pg_sys::SPI_tuptable;
        if table.is_null() {
            return Vec::new();
        }
        (0..pg_sys::SPI_processed as usize)
            .filter_map(|row| {
                let mut is_null = false;
                let datum = pg_sys::SPI_getbinval(*(*table).vals.add(row), (*table).tupdesc, 1, &mut is_null);
                (!is_null).then(|| datum.value() as i64)
            })
            .collect()
    }

    /// The first column of the first row of the last result, as a bool.
    ///
    /// # Safety
    /// SAFETY: call after a successful SELECT through SPI whose first column is a bool, before
    /// [`finish`]: SPI_tuptable then holds that result.
    pub unsafe fn first_bool() -> Option<bool> {
        let table = pg_sys::SPI_tuptable;
        if table.is_null() || pg_sys::SPI_processed == 0 {
            return None;
        }
        let mut is_null = false;
        let datum = pg_sys::SPI_getbinval(*(*table).vals, (*table).tupdesc, 1, &mut is_null);
        (!is_null).then(|| datum.value() != 0)
    }
}

/// The most statements [`KeptStatements`] keeps per backend; past it the
/// cache starts again (the statements' texts are a small fixed set, so
/// this only bounds a mistake).
const MOST_KEPT: usize = 256;

thread_local! {
    static KEPT: std::cell::RefCell<std::collections::HashMap<(String, bool), std::rc::Rc<pgrx::spi::OwnedPreparedStatement>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// `select` and `update` of the SPI client with each statement planned once
/// per backend and kept, keyed by its text: the subscription functions run
/// a dozen short statements per poll, and parsing and planning them anew
/// each time cost more than running them. Call them under the pinned
/// search_path (as the subscriptions' `as_owner` does): the plan cache
/// re-plans a kept statement when the tables change.
pub trait KeptStatements<'conn> {
    fn select_kept(
        &self,
        sql: &str,
        limit: Option<std::ffi::c_long>,
        args: &[pgrx::datum::DatumWithOid],
    ) -> pgrx::spi::SpiResult<pgrx::spi::SpiTupleTable<'conn>>;

    fn update_kept(
        &mut self,
        sql: &str,
        limit: Option<std::ffi::c_long>,
        args: &[pgrx::datum::DatumWithOid],
    ) -> pgrx::spi::SpiResult<pgrx::spi::SpiTupleTable<'conn>>;
}

fn kept_statement(
    client: &pgrx::spi::SpiClient<'_>,
    sql: &str,
    mutating: bool,
    args: &[pgrx::datum::DatumWithOid],
) -> pgrx::spi::SpiResult<std::rc::Rc<pgrx::spi::OwnedPreparedStatement>> {
    let key = (sql.to_owned(), mutating);
    if let Some(kept) = KEPT.with(|k| k.borrow().get(&key).cloned()) {
        return Ok(kept);
    }
    let types: Vec<pgrx::PgOid> = args.iter().map(|a| pgrx::PgOid::from(a.oid())).collect();
    let prepared = if mutating { client.prepare_mut(sql, &types)? } else { client.prepare(sql, &types)? };
    let kept = std::rc::Rc::new(prepared.keep());
    KEPT.with(|k| {
        let mut k = k.borrow_mut();
        if k.len() >= MOST_KEPT {
            k.clear();
        }
        k.insert(key, kept.clone());
    });
    Ok(kept)
}

impl<'conn> KeptStatements<'conn> for pgrx::spi::SpiClient<'conn> {
    fn select_kept(
        &self,
        sql: &str,
        limit: Option<std::ffi::c_long>,
        args: &[pgrx::datum::DatumWithOid],
    ) -> pgrx::spi::SpiResult<pgrx::spi::SpiTupleTable<'conn>> {
        let kept = kept_statement(self, sql, false, args)?;
        self.select(&*kept, limit, args)
    }

    fn update_kept(
        &mut self,
        sql: &str,
        limit: Option<std::ffi::c_long>,
        args: &[pgrx::datum::DatumWithOid],
    ) -> pgrx::spi::SpiResult<pgrx::spi::SpiTupleTable<'conn>> {
        let kept = kept_statement(self, sql, true, args)?;
        self.update(&*kept, limit, args)
    }
}
