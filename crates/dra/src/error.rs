use std::path::PathBuf;

/// Why a plugin could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum DraError {
    #[error("cannot listen on {}: {source} (is the kubelet's plugin directory mounted into the plugin's container?)", path.display())]
    Listen {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is in the way of the plugin's socket and is not a socket: remove it", path.display())]
    NotASocket { path: PathBuf },
    #[error("cannot start the plugin's gRPC runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("the plugin's gRPC server on {} failed: {source}", path.display())]
    Serve {
        path: PathBuf,
        source: tonic::transport::Error,
    },
}
