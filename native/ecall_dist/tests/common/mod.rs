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
    /// but another process can take it before epmd binds it (an outgoing
    /// connection of another test, from the same ephemeral range; another
    /// test's epmd, started on the same port the same way): epmd then
    /// exits at once, and the next attempt takes another port. Ready is
    /// when the listening socket on the port is this epmd's own (its
    /// descriptor, by /proc) and it answers a names request: an answer
    /// alone could come from another test's epmd that took the port.
    pub async fn start() -> Epmd {
        const ATTEMPTS: usize = 5;
        for attempt in 1..=ATTEMPTS {
            let port = free_port();
            let mut child = Command::new("epmd")
                .args(["-port", &port.to_string(), "-address", "127.0.0.1"])
                .kill_on_drop(true)
                .spawn()
                .expect("epmd on PATH (make deps installs Erlang)");
            let t0 = std::time::Instant::now();
            loop {
                let ours = child.id().is_some_and(|pid| listens_on(pid, port));
                if ours && epmd_names(port).await.is_some() {
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

/// Whether process `pid` holds the socket listening on 127.0.0.1:`port`
/// (Linux: the listener's inode in /proc/net/tcp among the process's
/// descriptors). A port taken between `free_port` and its reuse is then
/// told apart from one this process bound.
pub fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    // local_address is 0100007F:PPPP for 127.0.0.1; state 0A is LISTEN.
    let local = format!("0100007F:{port:04X}");
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 9 && f[1] == local && f[3] == "0A").then(|| f[9].to_string())
        })
        .collect();
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .any(|l| {
            inodes
                .iter()
                .any(|i| l.to_string_lossy() == format!("socket:[{i}]"))
        })
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
