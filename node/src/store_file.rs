//! `keel store check | backup PATH | compact`: upkeep of the store file, on keel-store's
//! [`Store::check_integrity`], [`Store::backup_to`] and [`Store::compact`].
//!
//! Check and compact open the store as its only writer, so they are refused (with what to do)
//! while another keel process holds it; backup opens it read-only and runs beside a `keel run` or
//! `keel node`, not beside a `keel serve` (which has the file alone: stop it first).

use std::path::Path;

use keel_store::{Integrity, MaintenanceError, Store};
use serde_json::json;

use crate::cli::StoreAction;
use crate::exit::{Exit, Failed};
use crate::home::{Home, HomeError};
use crate::render::Output;
use crate::stdout::outln;

/// Carries out one `keel store` action.
pub(crate) fn run(home: &Home, action: StoreAction, out: &Output) -> Result<(), Failed> {
    match action {
        StoreAction::Check => check(home, out),
        StoreAction::Backup { path } => backup(home, &path, out),
        StoreAction::Compact => compact(home, out),
    }
}

/// Opens the store as its only writer: what check and compact need.
fn open_alone(home: &Home) -> Result<Store, Failed> {
    let path = home.store_path()?;
    if !path.is_file() {
        return Err(HomeError::Missing { path }.into());
    }
    Ok(Store::open(&path).map_err(|reason| home.open_failed(path, reason))?)
}

/// A maintenance failure, naming the store file.
fn failed(home: &Home, what: &str, e: MaintenanceError) -> Failed {
    let file = home
        .store_path()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    Failed {
        exit: Exit::Failure,
        error: anyhow::Error::new(e).context(format!("{what} {file}")),
    }
}

fn check(home: &Home, out: &Output) -> Result<(), Failed> {
    let mut store = open_alone(home)?;
    let integrity = store
        .check_integrity()
        .map_err(|e| failed(home, "checking", e))?;
    let file = home.store_path()?;
    let (word, text) = match integrity {
        Integrity::Intact => ("intact", "intact: every page checks out"),
        Integrity::Repaired => (
            "repaired",
            "damaged and repaired from the previous commit (the last commit may be lost)",
        ),
    };
    if out.json() {
        outln!("{}", json!({"store": file, "integrity": word}))?;
    } else {
        outln!("{}: {text}", file.display())?;
    }
    Ok(())
}

fn backup(home: &Home, target: &Path, out: &Output) -> Result<(), Failed> {
    let store = home.open_existing()?;
    let backup = store
        .backup_to(target)
        .map_err(|e| failed(home, "backing up", e))?;
    if out.json() {
        outln!(
            "{}",
            json!({"backup": backup.file, "tables": backup.tables, "rows": backup.rows})
        )?;
    } else {
        outln!(
            "backed up {} rows in {} tables to {}",
            backup.rows,
            backup.tables,
            backup.file.display()
        )?;
    }
    Ok(())
}

fn compact(home: &Home, out: &Output) -> Result<(), Failed> {
    let mut store = open_alone(home)?;
    let compaction = store.compact().map_err(|e| failed(home, "compacting", e))?;
    let file = home.store_path()?;
    if out.json() {
        outln!(
            "{}",
            json!({
                "store": file,
                "passes": compaction.passes,
                "bytes_before": compaction.bytes_before,
                "bytes_after": compaction.bytes_after,
            })
        )?;
    } else {
        let size = |b: Option<u64>| b.map_or_else(|| "?".to_string(), |b| format!("{b} bytes"));
        outln!(
            "{}: compacted in {} passes, {} -> {}",
            file.display(),
            compaction.passes,
            size(compaction.bytes_before),
            size(compaction.bytes_after)
        )?;
    }
    Ok(())
}
