//! A session's environment: what is passed through from keel's own, the per-session HOME, the
//! spec's variables, and the account's credential.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::StartError;
use crate::spec::{Credential, SessionSpec};

/// Environment variables passed through from keel's own environment to every CLI: what a
/// process needs to run (PATH for `node`, locale, time zone), never credentials or CLI config.
pub const PASSTHROUGH_ENV: [&str; 7] =
    ["PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "TMPDIR"];

/// The base environment of a session: pass-through variables, the per-session HOME, then the
/// spec's own `env` (which wins).
pub fn base_env(spec: &SessionSpec, home: &Path) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for name in PASSTHROUGH_ENV {
        if let Ok(v) = std::env::var(name) {
            env.insert(name.to_owned(), v);
        }
    }
    env.entry("PATH".to_owned())
        .or_insert_with(|| "/usr/local/bin:/usr/bin:/bin".to_owned());
    env.insert("HOME".to_owned(), home.display().to_string());
    for (k, v) in &spec.env {
        env.insert(k.clone(), v.clone());
    }
    env
}

/// The account's secret, resolved the one way adapters must ([`Credential::secret`]: the spec's
/// env first, then ours, or the account's private key file).
///
/// # Errors
/// [`StartError::MissingCredential`] naming the variable or the file.
pub fn credential_value(spec: &SessionSpec) -> Result<Option<(Credential, String)>, StartError> {
    let secret = spec
        .account
        .credential
        .secret(|name| spec.env_var(name))
        .map_err(|e| StartError::MissingCredential(e.to_string()))?;
    Ok(secret.map(|v| (spec.account.credential.clone(), v)))
}
