//! The one place keel builds an HTTP client for model endpoints.
//!
//! reqwest is built with rustls and no bundled crypto provider (no OpenSSL, no aws-lc C build on
//! small machines); the ring provider is installed here, once, before any client exists.

use std::time::Duration;

use crate::error::HarnessError;

/// How long connecting to an endpoint may take.
pub const CONNECT_TIMEOUT_MS: u64 = 10_000;

/// Installs ring as the process-wide rustls provider if none is installed yet. Idempotent; another
/// provider installed first by the embedding process is kept.
pub fn install_crypto_provider() {
    // An error means a provider is already installed, which is exactly what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client for model endpoints: rustls, connect timeout, no overall timeout (streams are bounded
/// by an idle timeout per chunk in the caller instead).
///
/// # Errors
/// [`HarnessError`] (system) if the TLS setup fails.
pub fn model_client() -> Result<reqwest::Client, HarnessError> {
    install_crypto_provider();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
        .build()
        .map_err(|e| HarnessError::system(format!("cannot build the HTTP client: {e}")))
}
