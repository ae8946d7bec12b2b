//! What can end a pass, and the exit code each gives (DESIGN "Exit codes"). The cause stays typed
//! as its `#[source]`; the text is scrubbed where it is printed (the summary, a log line, a
//! command's error line: docs/architecture.md "Errors"), never here.

/// What `Unreachable` wraps: the typed error of whatever could not be reached.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// Bad flags, bad kubeconfig, missing required configuration: the user must fix something.
    #[error("configuration error: {0}")]
    Config(String),
    /// Configuration that could not be read or parsed: `what` names it, `source` says why.
    #[error("configuration error: {what}: {source}")]
    Invalid {
        what: String,
        #[source]
        source: Cause,
    },
    /// The job's own kubeconfig could not be found, read or merged.
    #[error("configuration error: {0}")]
    Kubeconfig(#[from] super::client::OwnKubeconfigError),
    /// The job's own cluster (or a store the pass cannot work without) could not be reached or
    /// refused us: no progress possible.
    #[error("{what}: {source}")]
    Unreachable {
        what: String,
        #[source]
        source: Cause,
    },
}

impl PassError {
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Config(_) | Self::Invalid { .. } | Self::Kubeconfig(_) => 2,
            Self::Unreachable { .. } => 1,
        }
    }

    /// A kube error on the job's own cluster while doing `what`.
    pub fn kube(what: impl Into<String>, err: kube::Error) -> Self {
        Self::unreachable(what, err)
    }

    /// The configuration `what` could not be read or parsed because of `source`.
    pub fn invalid(what: impl Into<String>, source: impl Into<Cause>) -> Self {
        Self::Invalid {
            what: what.into(),
            source: source.into(),
        }
    }

    /// `what` failed because of `source`.
    pub fn unreachable(what: impl Into<String>, source: impl Into<Cause>) -> Self {
        Self::Unreachable {
            what: what.into(),
            source: source.into(),
        }
    }
}
