//! Confinement of file paths to the working directory, symlinks included.
//!
//! A requested path is resolved against the working directory, `.` and `..` are folded lexically,
//! then the longest prefix that exists is canonicalised (which resolves every symlink in it) and
//! the rest re-attached. The result must stay under the canonical working directory. A symlink
//! inside the directory that points outside is therefore refused.
//!
//! Limitation: this is a check before use, not a sandbox; a process racing to swap a directory
//! for a symlink between the check and the open could escape. Workers that run untrusted models
//! should also run each session in a container.

use std::path::{Component, Path, PathBuf};

use super::ToolError;

/// Resolves `requested` inside `root` (which must be canonical). With `must_exist`, the target must
/// exist.
///
/// # Errors
/// [`ToolError`] with category permission for an escape, business_rule for a bad or missing path.
pub fn confine(root: &Path, requested: &str, must_exist: bool) -> Result<PathBuf, ToolError> {
    if requested.contains('\0') {
        return Err(ToolError::input("path contains a NUL byte"));
    }
    let requested = if requested.trim().is_empty() {
        "."
    } else {
        requested
    };
    let joined = if Path::new(requested).is_absolute() {
        PathBuf::from(requested)
    } else {
        root.join(requested)
    };
    let mut lexical = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                if !lexical.pop() {
                    return Err(ToolError::permission(format!(
                        "{requested} escapes the working directory"
                    )));
                }
            }
            Component::CurDir => {}
            other => lexical.push(other.as_os_str()),
        }
    }
    // Canonicalise the longest existing prefix, then re-attach the missing tail.
    let mut existing = lexical.clone();
    let mut tail = Vec::new();
    while !existing.exists() && existing.symlink_metadata().is_err() {
        match (
            existing.file_name().map(|n| n.to_owned()),
            existing.parent().map(Path::to_path_buf),
        ) {
            (Some(name), Some(parent)) => {
                tail.push(name);
                existing = parent;
            }
            _ => break,
        }
    }
    let canonical = match existing.canonicalize() {
        Ok(c) => c,
        // A dangling symlink: its target does not exist, so we cannot prove it stays inside.
        Err(_) => {
            return Err(ToolError::permission(format!(
                "{requested} cannot be resolved (dangling link?)"
            )));
        }
    };
    let mut resolved = canonical;
    for name in tail.into_iter().rev() {
        resolved.push(name);
    }
    if !resolved.starts_with(root) {
        return Err(ToolError::permission(format!(
            "{requested} is outside the working directory"
        )));
    }
    if must_exist && !resolved.exists() {
        return Err(ToolError::input(format!("{requested} does not exist")));
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolErrorCategory;

    #[test]
    fn escapes_are_refused_and_inside_paths_resolve() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a.txt"), "a").unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("link-out")).unwrap();
        std::os::unix::fs::symlink(root.join("sub"), root.join("link-in")).unwrap();

        assert_eq!(
            confine(&root, "sub/a.txt", true).unwrap(),
            root.join("sub/a.txt")
        );
        assert_eq!(
            confine(&root, "link-in/a.txt", true).unwrap(),
            root.join("sub/a.txt")
        );
        assert_eq!(
            confine(&root, "sub/../new/b.txt", false).unwrap(),
            root.join("new/b.txt")
        );
        assert_eq!(confine(&root, "", true).unwrap(), root);
        for bad in [
            "../x",
            "/etc/passwd",
            "sub/../../x",
            "link-out/secret",
            "link-out",
        ] {
            let e = confine(&root, bad, false).unwrap_err();
            assert_eq!(e.category, ToolErrorCategory::Permission, "{bad}");
        }
        assert_eq!(
            confine(&root, "missing.txt", true).unwrap_err().category,
            ToolErrorCategory::BusinessRule
        );
    }
}
