//! keel's files are private to their owner (issue 16): the home and every folder keel makes in it are
//! created 0700, every file keel writes there (keel.toml, synthesis files, the logs of a detached run,
//! control files) 0600, at creation: the mode is given to `open`/`mkdir` themselves, so there is no
//! moment when another local user could open a file that is chmod-ed later. The store file is
//! created 0600 by keel-store the same way. A home made by an older keel (0755 and 0644) is not
//! changed behind the user's back: [`looser_than_private`] finds what is readable by others, and
//! `keel config` warns about it.

use std::fs::{DirBuilder, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The mode of every folder keel creates in its home: the owner only.
pub(crate) const DIR_MODE: u32 = 0o700;
/// The mode of every file keel creates in its home: the owner reads and writes.
pub(crate) const FILE_MODE: u32 = 0o600;
/// The permission bits that let a group or anybody else in.
const OTHERS_BITS: u32 = 0o077;
/// Most entries of a home's folders looked at by [`looser_than_private`]: a home with a huge
/// synthesis folder is still checked in bounded time (the rest are counted as not looked at).
const ENTRIES_CHECKED_MAX: usize = 10_000;

/// Creates `dir` and any missing parent 0700 (an existing folder is left as it is).
///
/// # Errors
/// The IO error of the `mkdir` that failed.
pub(crate) fn create_dir(dir: &Path) -> std::io::Result<()> {
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)
}

/// Creates (or truncates) `path` for writing, 0600 when it is new. An existing file keeps its mode;
/// `keel config` reports one that is looser.
///
/// # Errors
/// The IO error of the `open`.
pub(crate) fn create_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(path)
}

/// Creates `path` 0600 only if it does not exist yet (`AlreadyExists` otherwise).
///
/// # Errors
/// The IO error of the `open`, `AlreadyExists` included.
pub(crate) fn create_new_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
}

/// Writes `contents` to `path` through [`create_file`] (0600 when new).
///
/// # Errors
/// The IO error of the `open` or the write.
pub(crate) fn write_file(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    create_file(path)?.write_all(contents)
}

/// A file or folder of a home that others than its owner may read or enter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Looser {
    /// The file or folder.
    pub(crate) path: PathBuf,
    /// Its permission bits.
    pub(crate) mode: u32,
    /// Whether it is a folder.
    pub(crate) dir: bool,
}

impl std::fmt::Display for Looser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, want) = if self.dir {
            ("folder", DIR_MODE)
        } else {
            ("file", FILE_MODE)
        };
        write!(
            f,
            "{what} {} is {:04o}: others may read it; keel makes it {want:04o} (chmod {want:o} {})",
            self.path.display(),
            self.mode,
            self.path.display()
        )
    }
}

/// Every folder and file of the home (the home itself, its files, and one level of its folders, where
/// keel keeps synthesis files, logs and control files), plus the store file wherever it lives, whose
/// mode lets a group or others in. Entries that vanish or cannot be read while looking are skipped.
pub(crate) fn looser_than_private(home: &Path, store: &Path) -> Vec<Looser> {
    let mut found = Vec::new();
    let mut checked = 0usize;
    let look = |path: &Path, found: &mut Vec<Looser>| {
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return None;
        };
        let mode = meta.mode() & 0o7777;
        if (meta.is_dir() || meta.is_file()) && mode & OTHERS_BITS != 0 {
            found.push(Looser {
                path: path.to_path_buf(),
                mode,
                dir: meta.is_dir(),
            });
        }
        Some(meta.is_dir())
    };
    if look(home, &mut found) != Some(true) {
        return found;
    }
    let Ok(entries) = std::fs::read_dir(home) else {
        return found;
    };
    let mut folders = Vec::new();
    for entry in entries.flatten() {
        checked += 1;
        if checked > ENTRIES_CHECKED_MAX {
            return found;
        }
        let path = entry.path();
        if look(&path, &mut found) == Some(true) {
            folders.push(path);
        }
    }
    for folder in folders {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            checked += 1;
            if checked > ENTRIES_CHECKED_MAX {
                return found;
            }
            look(&entry.path(), &mut found);
        }
    }
    if !store.starts_with(home) {
        look(store, &mut found);
    }
    found
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().mode() & 0o777
    }

    #[test]
    fn folders_and_files_are_created_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        create_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&tmp.path().join("a")), 0o700);
        let file = dir.join("f.md");
        write_file(&file, b"x").unwrap();
        assert_eq!(mode(&file), 0o600);
        assert!(create_new_file(&file).is_err());
    }

    #[test]
    fn a_looser_home_is_reported_and_a_private_one_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        create_dir(&home.join("synthesis")).unwrap();
        let store = home.join("keel.redb");
        write_file(&store, b"").unwrap();
        write_file(&home.join("synthesis/r.md"), b"").unwrap();
        assert_eq!(looser_than_private(&home, &store), Vec::new());
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(
            home.join("synthesis/r.md"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let found = looser_than_private(&home, &store);
        let paths: Vec<_> = found.iter().map(|l| l.path.clone()).collect();
        assert_eq!(paths, vec![home.clone(), home.join("synthesis/r.md")]);
        assert!(found[0].to_string().contains("0755"), "{}", found[0]);
    }
}
