//! The links' own TLS checks, both ways, against certificates from a CA
//! the other side does not trust: as a client, a link refuses a listener
//! whose certificate it cannot verify; as a listener, an identity refuses
//! a client whose certificate it cannot verify. Each with the TLS reason,
//! and beside a control that the same setup connects with trusted
//! certificates (so that what fails is the trust, not the setup).

mod common;

use common::{counted, host, unique, Epmd, COOKIE};
use ecall_dist::internals;
use ecall_dist::{Error, Identity, IdentityConfig, Listen, TlsClient, TlsOptions};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// Runs openssl; panics with its output when it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA named `ca` in `dir`, and a certificate signed by it for this host
/// (client and server use), as `{name}.pem` and `{name}.key`.
fn ca_and_cert(dir: &Path, ca: &str, name: &str) {
    let ext = dir.join(format!("{name}.cnf"));
    std::fs::write(
        &ext,
        format!(
            "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=DNS:{}\n",
            host()
        ),
    )
    .unwrap();
    if !dir.join(format!("{ca}.pem")).exists() {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN={ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
            ],
        );
    }
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={}", host()),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-extfile",
            &format!("{name}.cnf"),
            "-out",
            &format!("{name}.pem"),
        ],
    );
}

/// TLS options: this side's certificate `cert` (for both its links and its
/// listener), trusting the CA `trusts`.
fn tls(dir: &Path, cert: &str, trusts: &str) -> TlsClient {
    let p = |f: String| dir.join(f).to_string_lossy().into_owned();
    TlsClient::new(&TlsOptions {
        certfile: p(format!("{cert}.pem")),
        keyfile: p(format!("{cert}.key")),
        cacertfile: p(format!("{trusts}.pem")),
        sni: true,
        server_certfile: String::new(),
        server_keyfile: String::new(),
        server_cacertfile: String::new(),
    })
    .expect("TLS options")
}

async fn tls_identity(epmd: &Epmd, tls: TlsClient) -> Arc<Identity> {
    Identity::start(IdentityConfig {
        node: format!("{}@{}", unique("rust_tls"), host()),
        cookie: COOKIE.into(),
        tick: Duration::from_secs(1),
        handshake_timeout: Duration::from_secs(10),
        epmd_port: epmd.port,
        listen: Listen {
            addr: std::net::Ipv4Addr::LOCALHOST.into(),
            ports: (0, 0),
        },
        tls: Some(tls),
        register_retry: Duration::from_secs(1),
    })
    .await
    .expect("identity starts")
}

/// A handshake from `from` to `to`, bounded.
async fn connect(from: &Identity, to: &Identity) -> Result<(), Error> {
    tokio::time::timeout(
        Duration::from_secs(20),
        internals::connect(from, to.node(), COOKIE),
    )
    .await
    .expect("the attempt ended within 20 s")
    .map(|_| ())
}

/// The handshake error of a new identity with certificate `cert`, trusting
/// the CA `trusts`, connecting to `to`, which must not let it in; as text.
async fn refused_by(epmd: &Epmd, dir: &Path, cert: &str, trusts: &str, to: &Identity) -> String {
    let from = tls_identity(epmd, tls(dir, cert, trusts)).await;
    let e = connect(&from, to)
        .await
        .expect_err(&format!("{cert}, trusting {trusts}, got in"));
    assert!(matches!(e, Error::Handshake(_)), "{e}");
    e.to_string()
}

fn temp_dir() -> PathBuf {
    let d = std::env::temp_dir().join(unique("ecall_tls_trust"));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_refuse_certificates_they_cannot_verify_both_ways() {
    let dir = temp_dir();
    ca_and_cert(&dir, "ca_one", "one");
    ca_and_cert(&dir, "ca_one", "one_b");
    ca_and_cert(&dir, "ca_two", "two");
    let epmd = Epmd::start().await;
    // The listener: its certificate from CA one, trusting CA one only.
    let listener = tls_identity(&epmd, tls(&dir, "one", "ca_one")).await;

    // Control: a client with a certificate from CA one, trusting CA one.
    let (accepted, refused) = (
        listener.accepted.load(Relaxed),
        listener.refused.load(Relaxed),
    );
    let trusted = tls_identity(&epmd, tls(&dir, "one_b", "ca_one")).await;
    if let Err(e) = connect(&trusted, &listener).await {
        panic!("trusted certificates on both sides did not connect: {e}");
    }
    assert_eq!(
        counted(&listener.accepted, accepted + 1).await,
        accepted + 1
    );

    // As a client: the link trusts CA two only, and the listener's
    // certificate is from CA one. The link refuses it, and the listener
    // counts the handshake it gave up.
    let text = refused_by(&epmd, &dir, "one_b", "ca_two", &listener).await;
    assert!(
        text.contains("TLS") && text.contains("certificate"),
        "as a client: {text}"
    );
    assert_eq!(counted(&listener.refused, refused + 1).await, refused + 1);

    // As a listener: the client trusts the listener's CA, but presents a
    // certificate from CA two, which the listener does not trust. The
    // listener refuses it and counts it; the client hears why.
    let text = refused_by(&epmd, &dir, "two", "ca_one", &listener).await;
    assert!(text.contains("UnknownCA"), "as a listener: {text}");
    assert_eq!(counted(&listener.refused, refused + 2).await, refused + 2);
    assert_eq!(
        listener.accepted.load(Relaxed),
        accepted + 1,
        "the untrusted client was accepted"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
