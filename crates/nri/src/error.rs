use crate::wire::WireError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum NriError {
    #[error(
        "cannot connect to the NRI socket {}: {source} (is the engine running, with NRI enabled?)",
        path.display()
    )]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the NRI connection failed: {0}")]
    Io(#[source] std::io::Error),
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("cannot decode the engine's {what}: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: prost::DecodeError,
    },
    #[error("the engine refused to register NRI plugin {index}-{name}: {message}")]
    Refused {
        name: String,
        index: String,
        message: String,
    },
    #[error(
        "the engine closed the NRI connection before plugin {0} was configured (see the engine's log for why)"
    )]
    ClosedEarly(String),
    #[error("bad NRI plugin index {0:?}: it is two digits, 00 to 99, and orders the plugins")]
    BadIndex(String),
    #[error("bad NRI plugin name {0:?}: a name is not empty and has no '/' or whitespace")]
    BadName(String),
    #[error(
        "bad {var}={value:?} from the engine: {why} (the engine starts pre-registered plugins with a connected socket's descriptor there)"
    )]
    BadInheritedSocket {
        var: &'static str,
        value: String,
        why: String,
    },
}
