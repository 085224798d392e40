//! Validation issues and load errors.

use std::fmt;

/// One problem in a topology file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyIssue {
    /// File name as given.
    pub file: String,
    /// 1-based line (0 if unknown).
    pub line: usize,
    /// 1-based column (0 if unknown).
    pub column: usize,
    /// Offending element, e.g. `switch leaf1 port up`.
    pub element: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for TopologyIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}: {}", self.file, self.line, self.column, self.element, self.message)
    }
}

/// Errors loading a topology.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// File could not be read.
    #[error("{file}: {source}")]
    Io {
        /// File name.
        file: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The file is invalid; every issue found is listed.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<TopologyIssue>),
}

impl TopologyError {
    /// Issues, if the error is a validation error.
    pub fn issues(&self) -> &[TopologyIssue] {
        match self {
            TopologyError::Invalid(v) => v,
            TopologyError::Io { .. } => &[],
        }
    }
}
