//! The C-node's errors.

/// Errors of the C-node.
#[derive(Debug)]
pub enum Error {
    /// A node name that is not `name@host`.
    BadName(String),
    /// A socket operation failed.
    Io(&'static str, std::io::Error),
    /// epmd refused or failed.
    Epmd(String),
    /// epmd refused to register this full node name: another node (or an
    /// earlier instance whose registration epmd has not yet dropped)
    /// holds it.
    NameTaken(String),
    /// The peer is not registered with its epmd.
    NotRegistered(String),
    /// The handshake failed.
    Handshake(String),
    /// The peer still holds a connection under our name.
    Alive,
    /// The peer node was restarted: the name answers, but it is a new
    /// incarnation, which knows nothing of this peer's receivers.
    Restarted,
    /// Inconsistent settings.
    Config(String),
}

impl Error {
    pub(crate) fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
        move |e| Error::Io(what, e)
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::BadName(s) => write!(f, "bad node name {s}"),
            Error::Io(what, e) => write!(f, "{what}: {e}"),
            Error::Epmd(s) => write!(f, "epmd: {s}"),
            Error::NameTaken(s) => write!(f, "epmd: the name {s} is taken by another node"),
            Error::NotRegistered(s) => write!(f, "{s} is not registered with epmd"),
            Error::Handshake(s) => write!(f, "handshake: {s}"),
            Error::Alive => write!(f, "the peer still holds a connection under our name"),
            Error::Restarted => write!(f, "the peer node restarted (new creation); link stopped"),
            Error::Config(s) => write!(f, "configuration: {s}"),
        }
    }
}

impl std::error::Error for Error {}

/// The errno-style name that Erlang's `inet` gives an I/O error of this
/// kind (`econnreset`, `epipe`, ...), or `other`.
pub fn posix_name(kind: std::io::ErrorKind) -> &'static str {
    use std::io::ErrorKind as K;
    match kind {
        K::ConnectionReset => "econnreset",
        K::BrokenPipe => "epipe",
        K::ConnectionRefused => "econnrefused",
        K::ConnectionAborted => "econnaborted",
        K::NotConnected => "enotconn",
        K::TimedOut => "etimedout",
        K::AddrNotAvailable => "eaddrnotavail",
        K::AddrInUse => "eaddrinuse",
        K::OutOfMemory => "enomem",
        // `HostUnreachable` and `NetworkUnreachable` can be named only
        // from Rust 1.83 (the workspace supports 1.80), but the standard
        // library has decoded those errnos to them for longer.
        _ => match format!("{kind:?}").as_str() {
            "HostUnreachable" => "ehostunreach",
            "NetworkUnreachable" => "enetunreach",
            _ => "other",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    #[test]
    fn posix_names_follow_inet() {
        assert_eq!(posix_name(io::ErrorKind::ConnectionReset), "econnreset");
        assert_eq!(posix_name(io::ErrorKind::BrokenPipe), "epipe");
        assert_eq!(posix_name(io::ErrorKind::OutOfMemory), "enomem");
        assert_eq!(posix_name(io::ErrorKind::UnexpectedEof), "other");
        // Linux errno values, decoded by the standard library.
        #[cfg(target_os = "linux")]
        for (errno, name) in [
            (113, "ehostunreach"),
            (101, "enetunreach"),
            (111, "econnrefused"),
        ] {
            assert_eq!(posix_name(io::Error::from_raw_os_error(errno).kind()), name);
        }
    }
}
