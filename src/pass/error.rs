//! What can end a pass, and the exit code each gives (DESIGN "Exit codes").

use crate::scrub::scrub;

#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// Bad flags, bad kubeconfig, missing required configuration: the user must fix something.
    #[error("configuration error: {0}")]
    Config(String),
    /// The job's own cluster could not be reached or refused us: no progress possible.
    #[error("{what}: {message}")]
    Unreachable { what: String, message: String },
}

impl PassError {
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Config(_) => 2,
            Self::Unreachable { .. } => 1,
        }
    }

    /// Wrap a kube error on the job's own cluster; the text is scrubbed before it goes anywhere.
    pub fn kube(what: impl Into<String>, err: &kube::Error) -> Self {
        Self::Unreachable {
            what: what.into(),
            message: scrub(&err.to_string()),
        }
    }
}
