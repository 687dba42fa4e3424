//! TLS on the HTTP API, when `[server] tls_cert` and `tls_key` of keel.toml name a certificate and
//! its key (`keel serve` and a coordinator node's daemon alike): every connection is TLS 1.2 or 1.3
//! (rustls on ring, the same loader as TLS between nodes), and nothing answers plain HTTP. Each
//! handshake runs in its own task, bounded by [`HANDSHAKE_WAIT`], so a slow or silent client never
//! holds up the others; the API sees only connections whose handshake succeeded.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(10);
/// Connections whose handshake finished, waiting for the server to take them.
const READY_MAX: usize = 64;
/// The pause after a failed accept (out of file descriptors, ...), so the loop does not spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
/// Most handshakes in progress at once: a client that opens connections and never finishes their
/// handshakes holds at most this many descriptors and tasks (each for [`HANDSHAKE_WAIT`] at
/// most); past it a new connection is closed at once, so the store, the harness processes and the
/// cluster keep their descriptors.
const HANDSHAKES_MAX: usize = 256;

/// The API's TLS identity: the acceptor built from the certificate chain and the private key.
///
/// # Errors
/// When a file is missing, not PEM, or the key is readable by others (the message names the file).
pub(crate) fn acceptor(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    let config = keel_cluster::server_identity(cert, key).context("TLS on the HTTP API")?;
    Ok(TlsAcceptor::from(config))
}

/// A listener whose connections are TLS sessions: axum serves it as it serves a TCP listener.
pub(crate) struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Accept on `listener` and run each connection's handshake with `acceptor`.
    ///
    /// # Errors
    /// When the listener's address cannot be read.
    pub(crate) fn new(listener: TcpListener, acceptor: TlsAcceptor) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let (ready_tx, ready) = mpsc::channel(READY_MAX);
        let accepting = tokio::spawn(accept_loop(listener, acceptor, ready_tx));
        Ok(Self {
            ready,
            addr,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let handshakes = std::sync::Arc::new(tokio::sync::Semaphore::new(HANDSHAKES_MAX));
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(connection) => connection,
            Err(e) => {
                tracing::debug!(error = %e, "accepting an API connection failed");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let Ok(permit) = std::sync::Arc::clone(&handshakes).try_acquire_owned() else {
            tracing::warn!(%peer, "{HANDSHAKES_MAX} API handshakes in progress: connection closed");
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_WAIT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let _ = ready.send((tls, peer)).await;
                }
                Ok(Err(e)) => {
                    tracing::info!(%peer, error = %e, "an API connection failed its TLS handshake");
                }
                Err(_) => {
                    tracing::info!(%peer, "an API connection did not finish its TLS handshake in time");
                }
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop ended (the runtime is stopping): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}
