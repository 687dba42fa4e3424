//! TLS between nodes, when a certificate is configured: mutual TLS over ractor_cluster's transport.
//! Every node presents its certificate (chained to the cluster's CA) and accepts only a peer whose
//! certificate that CA signed, both when it listens and when it joins; the cookie handshake then
//! runs inside the encrypted session as before. The private key must be a file only its owner may
//! read, like the cookie.
//!
//! The crypto provider is rustls's `ring` provider, named explicitly: the build holds two providers
//! (ractor_cluster's tokio-rustls defaults bring aws-lc-rs), so rustls would not pick one itself.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The PEM files of a node's TLS identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// This node's certificate chain (its certificate first).
    pub cert: PathBuf,
    /// This node's private key (mode 600 or stricter).
    pub key: PathBuf,
    /// The CA certificates that sign the cluster's nodes' certificates: a peer is accepted only
    /// with a certificate one of them signed.
    pub ca: PathBuf,
}

/// Why a node's TLS identity was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read or holds no valid PEM of its kind.
    #[error("the TLS {what} file {path}: {source}")]
    Pem {
        /// Which file: certificate, key or CA.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: rustls::pki_types::pem::Error,
    },
    /// A certificate file holds no certificate.
    #[error("the TLS {what} file {path} holds no certificate")]
    Empty {
        /// Which file: certificate or CA.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// The private key's file could not be inspected.
    #[error("cannot read the TLS key file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Others may read or write the private key.
    #[error(
        "the TLS key file {path} is accessible to other users (mode {mode:o}); run `chmod 600 {path}`"
    )]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A CA certificate was refused as a trust anchor.
    #[error("the TLS CA file {path}: {source}")]
    Anchor {
        /// The file.
        path: PathBuf,
        /// Why.
        source: rustls::Error,
    },
    /// The peers' certificate verifier could not be built.
    #[error("the TLS peer verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// rustls refused the configuration (a key that does not match the certificate, ...).
    #[error("the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// A node's TLS: what it accepts sessions with and what it joins peers with.
#[derive(Clone)]
pub struct NodeTls {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTls").finish_non_exhaustive()
    }
}

fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |source| TlsError::Pem {
        what,
        path: path.to_path_buf(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem)?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let meta = std::fs::metadata(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TlsError::Permissions {
            path: path.to_path_buf(),
            mode,
        });
    }
    PrivateKeyDer::from_pem_file(path).map_err(|source| TlsError::Pem {
        what: "key",
        path: path.to_path_buf(),
        source,
    })
}

impl NodeTls {
    /// Read a node's identity and the cluster's CA from `files` and build both sides of mutual TLS.
    ///
    /// # Errors
    /// [`TlsError`] naming the file and what is wrong with it.
    pub fn load(files: &TlsFiles) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certificates("certificate", &files.cert)?;
        let key = private_key(&files.key)?;
        let mut roots = RootCertStore::empty();
        for ca in certificates("CA", &files.ca)? {
            roots.add(ca).map_err(|source| TlsError::Anchor {
                path: files.ca.clone(),
                source,
            })?;
        }
        let roots = Arc::new(roots);
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
                .build()?;
        let server = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
        })
    }

    /// How the node server accepts sessions.
    pub(crate) fn incoming(&self) -> ractor_cluster::IncomingEncryptionMode {
        ractor_cluster::IncomingEncryptionMode::Tls(self.acceptor.clone())
    }

    /// Open an encrypted session to the node at `peer`, whose certificate must name its IP address.
    pub(crate) async fn connect(
        &self,
        server: &crate::NodeServerRef,
        peer: SocketAddr,
    ) -> Result<(), ractor_cluster::ClientConnectErr> {
        ractor_cluster::client_connect_enc(
            server,
            peer,
            self.connector.clone(),
            ServerName::IpAddress(peer.ip().into()),
        )
        .await
    }
}

/// A TLS server identity without client certificates, from a certificate chain and its private
/// key under the same rules as a node's (the key private, the files named in every error): the
/// HTTP API's, whose clients prove themselves with a bearer token instead. TLS 1.2 and 1.3 on the
/// ring provider; ALPN offers HTTP/1.1.
///
/// # Errors
/// [`TlsError`] naming the file and what is wrong with it.
pub fn server_identity(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates("certificate", cert)?;
    let key = private_key(key)?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
