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
