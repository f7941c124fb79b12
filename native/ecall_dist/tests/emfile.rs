//! An identity whose process is out of file descriptors: accept fails with
//! EMFILE, and the accept loop must neither spin (it took a core, and
//! starved the node of descriptors for as long as connections kept coming)
//! nor stop. Its own test binary: it lowers the descriptor limit of the
//! whole process.

mod common;

use common::{counted, identity, Epmd, COOKIE};
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// utime + stime of this process, in clock ticks, read from `stat` (opened
/// before the descriptors run out).
fn cpu_ticks(stat: &mut std::fs::File) -> u64 {
    use std::io::{Read, Seek};
    let mut text = String::new();
    stat.seek(std::io::SeekFrom::Start(0)).unwrap();
    stat.read_to_string(&mut text).unwrap();
    let stat = text;
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    // Fields 14 and 15 of stat; `after` starts at field 3.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Sets the soft limit on descriptors of this process (the hard one stays,
/// so that the limit can be raised again).
fn set_nofile(soft: usize, hard: usize) {
    let pid = std::process::id().to_string();
    let lim = format!("--nofile={soft}:{hard}");
    let ok = Command::new("prlimit")
        .args(["--pid", &pid, &lim])
        .status()
        .expect("prlimit (util-linux)")
        .success();
    assert!(ok, "prlimit {lim}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_accept_loop_backs_off() {
    let epmd = Epmd::start().await;
    let id = identity(&epmd, COOKIE, Duration::from_secs(1)).await;
    let (soft, hard) = {
        let out = Command::new("prlimit")
            .args([
                "--pid",
                &std::process::id().to_string(),
                "--nofile",
                "-o",
                "SOFT,HARD",
                "--noheadings",
            ])
            .output()
            .unwrap();
        let s = String::from_utf8(out.stdout).unwrap();
        let mut it = s.split_whitespace().map(|x| x.parse::<usize>().unwrap());
        (it.next().unwrap(), it.next().unwrap())
    };
    let mut stat = std::fs::File::open("/proc/self/stat").unwrap();
    let used = std::fs::read_dir("/proc/self/fd").unwrap().count();
    // A few descriptors to spare, then none.
    set_nofile(used + 4, hard);
    // Another process makes the connections (its descriptors are its own):
    // 40 that stay open, more than this process can accept.
    let port = id.port();
    let mut clients = Command::new("python3")
        .args([
            "-c",
            &format!(
                "import resource, socket, sys\n\
                 h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n\
                 resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))\n\
                 s = [socket.create_connection(('127.0.0.1', {port})) for _ in range(40)]\n\
                 print('open', flush=True)\n\
                 sys.stdin.read()\n"
            ),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(clients.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "open");
    // Two seconds with more connections waiting than descriptors: the
    // subject of the test is what the loop does meanwhile.
    let (e0, t0) = (id.accept_errors.load(Relaxed), cpu_ticks(&mut stat));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (e1, t1) = (id.accept_errors.load(Relaxed), cpu_ticks(&mut stat));
    set_nofile(soft, hard);
    drop(clients.stdin.take());
    let _ = clients.wait();
    let ticks_per_s = 100; // USER_HZ on Linux
    eprintln!(
        "in 2 s: {} accept errors, {} ms of CPU",
        e1 - e0,
        (t1 - t0) * 1000 / ticks_per_s
    );
    assert!(e1 > e0, "no accept error: the limit did not bite");
    // Waits doubling from 10 ms to 1 s: about 8 attempts in 2 s, where the
    // old loop made millions. Neither bound can be reached by load: the
    // waits are sleeps, which a loaded machine only lengthens (fewer
    // attempts fit in the 2 s), and the CPU is this process's own (its
    // ticks in /proc/self/stat, this test alone in its binary), which
    // other processes' load does not add to: a loaded machine gives it
    // less, never more. The old loop spun for the whole 2 s.
    assert!(e1 - e0 <= 20, "{} accept errors in 2 s", e1 - e0);
    assert!(
        (t1 - t0) * 1000 / ticks_per_s < 500,
        "{} ticks of CPU",
        t1 - t0
    );
    // With descriptors again, the loop accepts: a handshake from another
    // identity completes (within the loop's longest wait, 1 s, and the
    // handshake's own timeout).
    let other = identity(&epmd, COOKIE, Duration::from_secs(1)).await;
    let accepted = id.accepted.load(Relaxed);
    let conn = tokio::time::timeout(
        Duration::from_secs(10),
        ecall_dist::internals::connect(&other, id.node(), COOKIE),
    )
    .await
    .expect("the handshake did not complete in 10 s");
    if let Err(e) = conn {
        panic!("no connection after the limit was restored: {e}");
    }
    assert_eq!(counted(&id.accepted, accepted + 1).await, accepted + 1);
}
