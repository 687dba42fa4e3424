//! Mutual TLS between `keel node` processes on 127.0.0.1, with certificates made here (rcgen): a
//! worker with a certificate the cluster's CA signed joins and runs the coordinator's work; a worker
//! without TLS is refused during the handshake and never joins; a key file others may read never
//! starts a node.
//!
//! TLS on the HTTP API (`keel serve` here; a coordinator node's daemon serves the same `ApiServer`):
//! with `[server] tls_cert` and `tls_key` it answers https only (a plain HTTP request gets no HTTP
//! answer); `keel --server https://...` trusting the CA (`$KEEL_API_CA_FILE`) prints a run's
//! summary; a client that does not trust it is refused; a local `keel run` on the home reaches the
//! server it announces (`https://` in `server.json`) trusting `[server] tls_ca`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use keel_tests::fan_out::prepare;
use keel_tests::serve::{Server, quiet_survey, survey_files, worker_command};
use keel_tests::{Reaped, keel};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
};

const WAIT: Duration = Duration::from_secs(180);
/// Keel's cluster lines, and ractor_cluster's refusal of a session that is not TLS.
const LOG: &str = "error,keel_cluster=info,ractor_cluster=warn";

fn private(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A CA, and for each name a certificate for 127.0.0.1 it signed: `NAME.pem`, `NAME.key`, `ca.pem`.
fn certificates(dir: &Path, names: &[&str]) {
    let mut ca = CertificateParams::new(Vec::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name
        .push(DnType::CommonName, "keel test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    private(&dir.join("ca.pem"), &ca_cert.pem(), 0o644);
    let issuer = Issuer::new(ca, ca_key);
    for name in names {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, *name);
        let cert = params.signed_by(&key, &issuer).unwrap();
        private(&dir.join(format!("{name}.pem")), &cert.pem(), 0o644);
        private(
            &dir.join(format!("{name}.key")),
            &key.serialize_pem(),
            0o600,
        );
    }
}

fn tls_args(cmd: &mut std::process::Command, dir: &Path, name: &str) {
    let file = |ext: &str| -> PathBuf { dir.join(format!("{name}.{ext}")) };
    cmd.arg("--tls-cert")
        .arg(file("pem"))
        .arg("--tls-key")
        .arg(file("key"))
        .arg("--tls-ca")
        .arg(dir.join("ca.pem"));
}

#[test]
fn workers_join_over_mutual_tls_and_a_plain_worker_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    prepare(&work, "", 2, |i| format!("echo part {i} done"));
    let cookie = dir.path().join("cookie");
    private(&cookie, "keel-test-cookie-0123456789abcdef", 0o600);
    certificates(dir.path(), &["coordinator", "sealed"]);

    let mut cmd = keel(&work).unwrap();
    cmd.env("KEEL_LOG", LOG)
        .args([
            "node",
            "--role",
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--run",
            "fan out",
            "--plan",
            "plan.json",
            "--wait-workers",
            "1",
            "--cookie-file",
        ])
        .arg(&cookie);
    tls_args(&mut cmd, dir.path(), "coordinator");
    let mut coordinator = Reaped::spawn(cmd).unwrap();
    let line = coordinator.line_containing("listening on", WAIT).unwrap();
    let addr = line
        .split("listening on ")
        .nth(1)
        .unwrap()
        .trim()
        .to_string();

    // A worker that speaks plain TCP: the coordinator's TLS handshake refuses its session.
    let mut plain = worker_command(&work, &addr, "plain", &cookie);
    plain.env("KEEL_LOG", LOG);
    let plain = Reaped::spawn(plain).unwrap();
    coordinator
        .stderr_line_containing("Error establishing secure socket", WAIT)
        .unwrap();

    let mut sealed = worker_command(&work, &addr, "sealed", &cookie);
    sealed.env("KEEL_LOG", LOG);
    tls_args(&mut sealed, dir.path(), "sealed");
    let _sealed = Reaped::spawn(sealed).unwrap();
    let (status, out, err) = coordinator.wait_output(WAIT).unwrap();
    assert!(status.success(), "{status}\n{out}\n{err}");
    assert!(out.contains(": Completed"), "{out}");
    assert!(err.contains("worker joined worker=sealed"), "{err}");
    assert!(!err.contains("worker=plain"), "{err}");
    plain.kill();

    // A private key others may read: refused before the node starts, naming the fix.
    std::fs::set_permissions(
        dir.path().join("sealed.key"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let mut careless = worker_command(&work, &addr, "careless", &cookie);
    tls_args(&mut careless, dir.path(), "sealed");
    let (status, out, err) = Reaped::spawn(careless).unwrap().wait_output(WAIT).unwrap();
    assert!(!status.success(), "{out}");
    assert!(err.contains("accessible to other users"), "{err}");
}

#[test]
fn the_http_api_speaks_only_tls_when_keel_toml_names_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    survey_files(&work);
    let init = keel(&work).unwrap().arg("init").output().unwrap();
    assert!(init.status.success(), "{init:?}");
    certificates(dir.path(), &["api"]);
    let file = |name: &str| dir.path().join(name).display().to_string();
    std::fs::write(
        work.join(".keel/keel.toml"),
        format!(
            "[server]\ntls_cert = \"{}\"\ntls_key = \"{}\"\ntls_ca = \"{}\"\n",
            file("api.pem"),
            file("api.key"),
            file("ca.pem")
        ),
    )
    .unwrap();
    let server = Server::start(&work);
    assert!(
        server.url.starts_with("https://127.0.0.1:"),
        "{}",
        server.url
    );

    // Plain HTTP on the same port: no HTTP answer (the TLS server takes it for a bad handshake).
    let plain = {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&server.addr).unwrap();
        stream.set_read_timeout(Some(WAIT)).unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: keel\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut raw = Vec::new();
        let _ = stream.read_to_end(&mut raw);
        raw
    };
    assert!(
        !plain.starts_with(b"HTTP/"),
        "{}",
        String::from_utf8_lossy(&plain)
    );

    // A client trusting the CA: a run over https, with its live view on the event stream.
    let client = tempfile::tempdir().unwrap();
    let mut trusting = server.keel(client.path());
    trusting.env("KEEL_API_CA_FILE", dir.path().join("ca.pem"));
    let summary = quiet_survey(trusting, &work);
    assert!(summary.contains("failures: none"), "{summary}");

    // A client that does not trust it (the platform's roots): refused, nothing sent.
    let out = server
        .keel(client.path())
        .env_remove("KEEL_API_CA_FILE")
        .args(["runs"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("cannot reach the keel server"), "{err}");

    // A local command on the home reaches the server it announces, trusting `[server] tls_ca`.
    let announced = std::fs::read_to_string(work.join(".keel/server.json")).unwrap();
    assert!(announced.contains("https://127.0.0.1:"), "{announced}");
    let mut local = keel(&work).unwrap();
    local.env_remove("KEEL_API_CA_FILE");
    assert_eq!(quiet_survey(local, &work), summary);
}
