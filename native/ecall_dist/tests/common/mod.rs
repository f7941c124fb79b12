//! Helpers shared by the integration tests: a private epmd per test, node
//! names that do not collide, and a C-node identity registered with it.
#![allow(dead_code)]

pub mod erl;

use ecall_dist::{Identity, IdentityConfig, Listen};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::process::{Child, Command};

pub const COOKIE: &str = "ecall_test_cookie";
pub const WAIT: Duration = Duration::from_secs(30);

/// Waits until `counter` reaches `want`, for at most [`WAIT`], and
/// returns what it reads then. For the counts an identity makes when a
/// handshake task ends (`accepted`, `refused`): the task counts after its
/// last message, or after the socket closed, so the other side can be done
/// first. Nothing signals the count; it is polled.
pub async fn counted(counter: &AtomicU64, want: u64) -> u64 {
    let t0 = std::time::Instant::now();
    loop {
        let n = counter.load(Relaxed);
        if n >= want || t0.elapsed() > WAIT {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn host() -> String {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    h.trim().split('.').next().unwrap().to_string()
}

pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A private epmd, killed on drop.
pub struct Epmd {
    pub port: u16,
    _child: Child,
}

impl Epmd {
    /// Starts epmd on a free port. The port is free when `free_port` looks,
    /// but another test's outgoing connection can take it (it comes from the
    /// same ephemeral range) before epmd binds it: epmd then exits at once,
    /// and the next attempt takes another port.
    pub async fn start() -> Epmd {
        const ATTEMPTS: usize = 5;
        for attempt in 1..=ATTEMPTS {
            let port = free_port();
            let mut child = Command::new("epmd")
                .args(["-port", &port.to_string(), "-address", "127.0.0.1"])
                .kill_on_drop(true)
                .spawn()
                .expect("epmd on PATH (make deps installs Erlang)");
            // Ready when it answers a names request.
            let t0 = std::time::Instant::now();
            loop {
                if epmd_names(port).await.is_some() {
                    return Epmd {
                        port,
                        _child: child,
                    };
                }
                if let Some(status) = child.try_wait().expect("epmd's status") {
                    eprintln!(
                        "epmd on port {port} exited ({status}), attempt {attempt} of {ATTEMPTS}"
                    );
                    break;
                }
                assert!(t0.elapsed() < WAIT, "epmd on port {port} did not answer");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        panic!("epmd did not start in {ATTEMPTS} attempts");
    }
}

pub async fn epmd_names(port: u16) -> Option<Vec<(String, u16)>> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    erl_dist::epmd::EpmdClient::new(tokio_util::compat::TokioAsyncReadCompatExt::compat(stream))
        .get_names()
        .await
        .ok()
}

/// The configuration of [`identity`]: a unique name, any loopback port,
/// no TLS, handshakes of at most 10 s.
pub fn identity_config(epmd: &Epmd, cookie: &str, tick: Duration) -> IdentityConfig {
    IdentityConfig {
        node: format!("{}@{}", unique("rust_ecall"), host()),
        cookie: cookie.into(),
        tick,
        handshake_timeout: Duration::from_secs(10),
        epmd_port: epmd.port,
        listen: Listen {
            addr: std::net::Ipv4Addr::LOCALHOST.into(),
            ports: (0, 0),
        },
        tls: None,
        register_retry: Duration::from_secs(1),
    }
}

pub async fn identity(epmd: &Epmd, cookie: &str, tick: Duration) -> Arc<Identity> {
    Identity::start(identity_config(epmd, cookie, tick))
        .await
        .expect("identity starts")
}

/// Every corpus file with the verdict its name asks for.
pub fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/inbound");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .expect("corpus folder")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    files.sort();
    assert!(files.len() >= 20, "corpus has {} files", files.len());
    files
}
